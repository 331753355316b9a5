"""Typo tolerance of a text query on a product index: each query word the version's text never holds is
corrected to its nearest written word (``store.text.spelling``) within an edit budget, as Typesense and
Meilisearch allow by default: one edit (a substitution, insertion, deletion or swap of two neighbours) in a
word of 5 to 8 letters, two from 9. Words of letters only are corrected (not "x200", and never a word of a
spaceless script: its bigrams are matched as written), at most ``MAX_CORRECTED`` of them per query.

The corrected query is what the dense channels encode (a typo moves the query's embedding too) and what
the response shows (``corrected_query``); the lexical channel searches the corrected words' terms at
``FUZZY_WEIGHT`` of a typed term's weight, so a product matching the query as typed ranks above one that
matches only as corrected. A word the vocabulary holds, as written or by one of its stems, is left alone:
clean queries pay one dictionary look-up per word.

A word the catalogue cannot correct (none near enough, or the query is ``certain``ly in a language the
catalogue does not write) is looked up in the query language's dictionary (``service.search.dictionaries``,
wordfreq's lists): one it holds is a clean word of that language and left alone; one it does not hold is
corrected to its nearest word within the same budget (a long word no common word is one edit from, to a
rarer one: ``dictionaries.nearest_in``). That correction is for the dense channels (the
multilingual encoders read "Äpfel" where "Äpcel" moved the embedding off its meaning) and the response:
the catalogue does not hold the word, so the lexical channel searches the query as typed there.
Languages looked up: a ``certain`` query's own; otherwise the detected one and every language of the model
and the catalogue with a list, since a mistyped one-word query is rarely identified (bench/typos.py: the
right language among the detector's first three for 98 of 162 typo'd queries).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import regex

from service.search.dictionaries import QueryDictionaries, nearest_in
from store.products.channels import ProductChannels
from store.text.lexical import analyze, words_of

DEFAULT_TYPOS = 2  # a request's ``typos`` when it sends none: the budget by word length, up to two edits
ONE_EDIT_FROM, TWO_EDITS_FROM = 5, 9  # letters
MAX_CORRECTED = 8  # unknown words looked up per query (each unknown word costs a fuzzy look-up, ~0.1 ms)
MAX_FROM_DICTIONARY = 3  # words looked up in dictionaries per query (each a fuzzy look-up per language)
FUZZY_WEIGHT = 0.5  # of a typed term, on a corrected term's BM25 score and its share of the coverage
_WORDS = regex.compile(r"\w+", regex.UNICODE)


def edit_budget(word: str, typos: int) -> int:
    """The edits a word of this length may be corrected by, at most ``typos``."""
    n = len(word)
    allowed = 2 if n >= TWO_EDITS_FROM else 1 if n >= ONE_EDIT_FROM else 0
    return min(allowed, typos)


@dataclass
class Correction:
    """A query with its mistyped words corrected."""

    text: str  # the query, each corrected word replaced by its vocabulary form (folded)
    words: dict[str, str]  # typed word (folded) -> the vocabulary word it was corrected to
    # analysed term of a corrected word -> the typed word (terms the typed query also has are left out)
    terms: dict[str, str] = field(default_factory=dict)
    # typed word -> the language whose dictionary it was corrected from (a word the catalogue never writes)
    dictionary: dict[str, str] = field(default_factory=dict)
    lexical: str | None = None  # what the lexical channel analyses, if not ``text``: catalogue words only

    @property
    def lexical_text(self) -> str:
        return self.text if self.lexical is None else self.lexical

    def weights(self) -> dict[str, float]:
        """The lexical channel's factor on the corrected words' terms
        (``store.products.hybrid.HybridQuery``)."""
        return dict.fromkeys(self.terms, FUZZY_WEIGHT)

    def matched(self, terms: Iterable[str]) -> dict[str, str]:
        """{typed word: the form it matched as} for the corrected words among a hit's matched ``terms``."""
        typed = [self.terms[t] for t in terms if t in self.terms]
        # A dictionary's correction matched no term; every hit's dense channels were scored with it.
        return {w: self.words[w] for w in dict.fromkeys([*typed, *self.dictionary])}


def correct_query(
    channels: ProductChannels | None,
    text: str,
    languages: Sequence[str | None],
    typos: int | None,
    *,
    certain: bool = False,
    dictionaries: QueryDictionaries | None = None,
) -> Correction | None:
    """``text`` with each word the version does not hold corrected (``languages``: the query's likely
    ones, most likely first; its words are stemmed as these and as the catalogue's); None where nothing is
    corrected (``typos`` 0, no text fields, every word known or none near enough). A query ``certain``ly
    in a language the catalogue is not written in is not corrected to the catalogue's words (its words are
    unknown for that, not mistyped, and correcting them to the catalogue's only moved it off its meaning),
    only from its language's dictionary (``dictionaries``; None: no dictionary corrections)."""
    budget = DEFAULT_TYPOS if typos is None else typos
    if channels is None or budget <= 0 or channels.info.texts == 0:
        return None
    foreign = bool(certain and languages and languages[0] not in channels.info.text_languages)
    if foreign and dictionaries is None:
        return None
    candidates = [w for w in dict.fromkeys(words_of(text)) if w.isalpha() and edit_budget(w, budget) > 0]
    if not candidates:
        return None
    vocabulary = channels.vocabulary()
    # A word is known if any language the shop writes in stems it to an indexed stem.
    langs = list(dict.fromkeys([*languages, *channels.info.text_languages, None]))
    words: dict[str, str] = {}
    from_dictionary: dict[str, str] = {}
    looked_up = in_dictionaries = 0
    for word in candidates:
        stems = list(dict.fromkeys(s for lang in langs for s in analyze(word, lang)))
        if vocabulary.knows(word, stems):
            continue
        if not foreign and looked_up < MAX_CORRECTED:
            looked_up += 1
            nearest = vocabulary.nearest(word, stems, edit_budget(word, budget))
            if nearest is not None:
                words[word] = nearest.word
                continue
        if dictionaries is not None and in_dictionaries < MAX_FROM_DICTIONARY:
            found = dictionaries.for_word(
                word, _dictionary_languages(dictionaries, languages, channels, certain)
            )
            if found:
                in_dictionaries += 1
                near = nearest_in(word, found, edit_budget(word, budget), vocabulary.words)
                if near is not None:
                    words[word] = near.word
                    from_dictionary[word] = near.lang
    if not words:
        return None
    nfkc = unicodedata.normalize("NFKC", text)
    corrected = _WORDS.sub(lambda m: words.get(m.group().casefold(), m.group()), nfkc)
    lexical = None
    if from_dictionary:  # the catalogue holds none of those words: they stay as typed for BM25
        lexical = _WORDS.sub(
            lambda m: (
                m.group()
                if m.group().casefold() in from_dictionary
                else words.get(m.group().casefold(), m.group())
            ),
            nfkc,
        )
    typed = {t for lang in langs for t in analyze(text, lang)}
    terms: dict[str, str] = {}
    for word, form in words.items():
        if word in from_dictionary:
            continue
        for lang in langs:
            for term in analyze(form, lang):
                if term not in typed:
                    terms.setdefault(term, word)
    return Correction(corrected, words, terms, from_dictionary, lexical)


def _dictionary_languages(
    dictionaries: QueryDictionaries,
    languages: Sequence[str | None],
    channels: ProductChannels,
    certain: bool,
) -> list[str]:
    """The languages whose dictionaries a word is looked up in: a certain query's own; else the likely
    ones first, then the model's and the catalogue's."""
    likely = [lang for lang in languages if lang]
    if certain:
        return likely[:1]
    return list(dict.fromkeys([*likely, *dictionaries.languages, *channels.info.text_languages]))
