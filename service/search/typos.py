"""Typo tolerance of a text query on a product index: each query word the version's text never holds is
corrected to its nearest written word (``store.spelling``) within an edit budget, as Typesense and
Meilisearch allow by default: one edit (a substitution, insertion, deletion or swap of two neighbours) in a
word of 5 to 8 letters, two from 9. Words of letters only are corrected (not "x200", and never a word of a
spaceless script: its bigrams are matched as written), at most ``MAX_CORRECTED`` of them per query.

The corrected query is what the dense channels encode (a typo moves the query's embedding too) and what
the response shows (``corrected_query``); the lexical channel searches the corrected words' terms at
``FUZZY_WEIGHT`` of a typed term's weight, so a product matching the query as typed ranks above one that
matches only as corrected. A word the vocabulary holds, as written or by one of its stems, is left alone:
clean queries pay one dictionary look-up per word.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import regex

from store.lexical import analyze, words_of
from store.products import ProductChannels

DEFAULT_TYPOS = 2  # a request's ``typos`` when it sends none: the budget by word length, up to two edits
ONE_EDIT_FROM, TWO_EDITS_FROM = 5, 9  # letters
MAX_CORRECTED = 8  # unknown words looked up per query (each unknown word costs a fuzzy look-up, ~0.1 ms)
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

    def weights(self) -> dict[str, float]:
        """The lexical channel's factor on the corrected words' terms (``store.hybrid.HybridQuery``)."""
        return dict.fromkeys(self.terms, FUZZY_WEIGHT)

    def matched(self, terms: Iterable[str]) -> dict[str, str]:
        """{typed word: the form it matched as} for the corrected words among a hit's matched ``terms``."""
        typed = [self.terms[t] for t in terms if t in self.terms]
        return {w: self.words[w] for w in dict.fromkeys(typed)}


def correct_query(
    channels: ProductChannels | None,
    text: str,
    languages: Sequence[str | None],
    typos: int | None,
    *,
    certain: bool = False,
) -> Correction | None:
    """``text`` with each word the version does not hold corrected (``languages``: the query's likely
    ones, most likely first; its words are stemmed as these and as the catalogue's); None where nothing is
    corrected (``typos`` 0, no text fields, every word known or none near enough, or a query ``certain``ly
    in a language the catalogue is not written in: its words are unknown for that, not mistyped, and
    correcting them to the catalogue's words only moved it off its meaning)."""
    budget = DEFAULT_TYPOS if typos is None else typos
    if channels is None or budget <= 0 or channels.info.texts == 0:
        return None
    if certain and languages and languages[0] not in channels.info.text_languages:
        return None
    candidates = [w for w in dict.fromkeys(words_of(text)) if w.isalpha() and edit_budget(w, budget) > 0]
    if not candidates:
        return None
    vocabulary = channels.vocabulary()
    # A word is known if any language the shop writes in stems it to an indexed stem.
    langs = list(dict.fromkeys([*languages, *channels.info.text_languages, None]))
    words: dict[str, str] = {}
    looked_up = 0
    for word in candidates:
        stems = list(dict.fromkeys(s for lang in langs for s in analyze(word, lang)))
        if vocabulary.knows(word, stems) or looked_up == MAX_CORRECTED:
            continue
        looked_up += 1
        nearest = vocabulary.nearest(word, stems, edit_budget(word, budget))
        if nearest is not None:
            words[word] = nearest.word
    if not words:
        return None
    nfkc = unicodedata.normalize("NFKC", text)
    corrected = _WORDS.sub(lambda m: words.get(m.group().casefold(), m.group()), nfkc)
    typed = {t for lang in langs for t in analyze(text, lang)}
    terms: dict[str, str] = {}
    for word, form in words.items():
        for lang in langs:
            for term in analyze(form, lang):
                if term not in typed:
                    terms.setdefault(term, word)
    return Correction(corrected, words, terms)
