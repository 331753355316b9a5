"""Decompounding of words of the compounding languages (German, Swedish, Dutch, Danish, Norwegian, Finnish):
"äppeljuice" is "äpple" + "juice", "orangensaft" is "orange" + "saft", so that a query written as one word
finds the text that writes its parts apart ("Äpple Juice").

A word (``MIN_WORD`` letters or more) is split into 2 (at most ``MAX_PARTS``) parts of ``MIN_PART`` letters
or more, each a known word;
between two parts may stand one of the language's linking morphemes (``LINKS``: German "Orange-n-saft",
Swedish "honung-s-melon"), and a modifier may have dropped or changed its last letters (``RESTORE``:
Swedish "äppel" for "äpple", "flick" for "flicka", German "Schul" for "Schule"), which are put back before
it is looked up. Known words are a given set (``known``: a dictionary of the language, such as wordfreq's
list) and the index's vocabulary (``store.text.spelling.Vocabulary``: its words; and its stems of ``MIN_STEM``
letters or more, so that a known word written in another inflection counts). Where a vocabulary is given,
the head (last part: what the compound is) must be written in the index, and a word the index writes whole
is never split (the catalogue matches it as written); without one, ``known`` decides both.

Of the splits that hold, the one with the fewest parts wins, then the longest head, then the fewest
letters of linking morpheme, then a modifier the index writes before one it does not, then the order of
``LINKS`` and ``RESTORE``: deterministic. A split is returned with its parts' terms as ``store.text.lexical``
analyses them in the language (the head as written, so its inflection is stemmed away), cached per word.

Query side only (``service.search.compounds``): the stored terms are unchanged, so the format is too.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import regex

from store.text.lexical import MAX_TERMS, analyze
from store.text.spelling import Vocabulary

MIN_PART = 3  # letters of a part ("ägg", "tee"); a shorter one matches too much by chance
# Letters of a word to split: two parts of three letters are mostly chance, as wordfreq's lists hold
# most three-letter strings and a shop's vocabulary holds several languages' (German "Melone" read as
# Dutch was "mel" + English "one" on the grocery catalogue: a rule from that false split, not a figure
# tuned on the bench).
MIN_WORD = 2 * MIN_PART + 1
# Letters of a stem by which a word counts as written in another inflection: a three-letter stem is
# shared by unrelated words (Swedish and German "filet" and the catalogue's "fil" on the grocery one).
MIN_STEM = 4
MAX_PARTS = 3
# Letters of each part of a split in three: wordfreq's large lists hold many three-letter fragments, which
# split any long word in three ("champ-ign-ons" in Dutch, "was-ermel-one" against an English index).
MIN_PART_OF_THREE = 4
MAX_WORD = 40  # longer words are not split: no product word is that long, and the cost grows with length
CACHED = 8192  # words per language and index

# Linking morphemes that may stand between a modifier and what follows it, "" first (none).
LINKS: dict[str, tuple[str, ...]] = {
    "de": ("", "s", "es", "n", "en", "e", "er"),
    "sv": ("", "s", "e", "a", "u", "o"),
    "nl": ("", "s", "en", "e"),
    "da": ("", "s", "e"),
    "no": ("", "s", "e"),
    "fi": ("",),
}
# (the modifier's ending in the compound, the word's ending): how a modifier's dictionary form is found.
RESTORE: dict[str, tuple[tuple[str, str], ...]] = {
    "de": (("", ""), ("", "e")),  # Schul-buch: Schule
    "sv": (("", ""), ("", "e"), ("", "a"), ("el", "le")),  # pojk-, flick-, gat-u-, äppel-: pojke, flicka...
    "nl": (("", ""),),
    "da": (("", ""), ("", "e")),
    "no": (("", ""), ("", "e")),
    "fi": (("", ""),),
}
_ALIASES = {"nb": "no", "nn": "no"}
_WORD = regex.compile(r"\w+", regex.UNICODE)  # as store.text.lexical splits words


def compounding(lang: str | None) -> str | None:
    """The language code ``LINKS`` knows ``lang`` by (``de-AT``: ``de``; ``nb``: ``no``), None if it is not
    one of the compounding languages split here."""
    if not lang:
        return None
    code = lang.split("-")[0].split("_")[0].lower()
    code = _ALIASES.get(code, code)
    return code if code in LINKS else None


@lru_cache(maxsize=CACHED)
def _analysed(word: str, lang: str) -> tuple[str, ...]:
    """``store.text.lexical.analyze`` of one word, kept: a query's words are read for each likely language,
    and
    the same words come back in the next queries."""
    return tuple(analyze(word, lang))


@dataclass(frozen=True)
class Split:
    """A compound's parts (dictionary forms; the head as written) and their analysed terms."""

    parts: tuple[str, ...]
    terms: tuple[str, ...]


class Decompounder:
    """Splits the words of one compounding language against one set of known words (read-only; thread-safe:
    its cache is ``functools.lru_cache``'s)."""

    def __init__(
        self, lang: str, known: Callable[[str], bool], index: Vocabulary | None = None, cached: int = CACHED
    ) -> None:
        code = compounding(lang)
        if code is None:
            raise ValueError(f"{lang!r} is not a compounding language split here ({', '.join(LINKS)})")
        self.lang = code
        self._known = known
        self._index = index
        self._links = LINKS[code]
        self._restore = RESTORE[code]
        self._cached = lru_cache(maxsize=cached)(self._split)

    def split(self, word: str) -> Split | None:
        """``word`` (folded: NFKC, case-folded, as ``store.text.lexical.words_of`` gives it) split into known
        parts; None where it is known whole, too short or long, not letters only, or splits into none."""
        return self._cached(word)

    def reading(self, text: str) -> list[str] | None:
        """``text``'s terms as ``store.text.lexical.analyze`` gives them in this language, each split word's
        term replaced by its parts' terms, in text order; None where no word of it splits (then nothing is
        analysed: a Snowball stem costs 10-75 us in Python)."""
        words = _WORD.findall(unicodedata.normalize("NFKC", text).casefold())
        splits = [self.split(word) for word in words]
        if not any(splits):
            return None
        terms: list[str] = []
        for word, found in zip(words, splits, strict=True):
            terms.extend(self._terms(word) if found is None else found.terms)
            if len(terms) >= MAX_TERMS:
                break
        return terms[:MAX_TERMS]

    # -- the split -------------------------------------------------------------------------------------------

    def _split(self, word: str) -> Split | None:
        if not (MIN_WORD <= len(word) <= MAX_WORD) or not word.isalpha() or self._whole(word):
            return None
        heads = [i for i in range(MIN_PART, len(word) - MIN_PART + 1) if self._whole(word[i:])]
        for parts in range(2, MAX_PARTS + 1):  # fewest parts first, then the longest head
            shortest = MIN_PART if parts == 2 else MIN_PART_OF_THREE
            for i in heads:
                if len(word) - i < shortest:
                    continue
                modifiers = self._modifiers(word[:i], parts - 1, shortest)
                if modifiers is not None:
                    found = (*modifiers, word[i:])
                    terms = tuple(t for part in found for t in self._terms(part))
                    return Split(found, terms)
        return None

    def _whole(self, word: str) -> bool:
        """Known as one word: to the index where one is given, else to ``known``. The head is held to the
        same test."""
        index = self._index
        if index is None:
            return self._known(word)
        if word in index.words:
            return True
        # Written in the index in another inflection: a word of the language whose stem is the index's. It
        # is stemmed only then, and only where one of the index's stems begins it (Snowball's stems are the
        # word's beginning but for a changed last letter, English "berri"): a stem costs 10-75 us in
        # Python, and stemming every candidate head would cost most of a query's time.
        if not self._known(word) or not any(word[:k] in index.stems for k in range(MIN_STEM, len(word) + 1)):
            return False
        return any(len(stem) >= MIN_STEM and stem in index.stems for stem in self._terms(word))

    def _terms(self, word: str) -> tuple[str, ...]:
        return _analysed(word, self.lang)

    def _part(self, base: str) -> bool:
        """A modifier's dictionary form is known: to ``known`` or written in the index."""
        return self._known(base) or (self._index is not None and base in self._index.words)

    def _modifiers(self, text: str, count: int, shortest: int) -> tuple[str, ...] | None:
        """``text`` (what precedes the head) as ``count`` known modifiers of ``shortest`` letters or more,
        each with its linking morpheme and restored ending, the longest last part first; None where it is
        none."""
        if count == 1:
            base = self._modifier(text, shortest)
            return None if base is None else (base,)
        for i in range(shortest, len(text) - shortest + 1):
            last = self._modifier(text[i:], shortest)
            if last is None:
                continue
            rest = self._modifiers(text[:i], count - 1, shortest)
            if rest is not None:
                return (*rest, last)
        return None

    def _modifier(self, text: str, shortest: int) -> str | None:
        """The dictionary form of a modifier written ``text`` (its linking morpheme included): the fewest
        letters of link first, then one the index writes, then the order of ``LINKS`` and ``RESTORE``."""
        for size in sorted({len(link) for link in self._links}):
            bases = []
            for link in self._links:
                if len(link) != size or not text.endswith(link) or len(text) - size < shortest:
                    continue
                stem = text[: len(text) - size]
                for end, repl in self._restore:
                    if stem.endswith(end):
                        base = stem[: len(stem) - len(end)] + repl
                        if len(base) >= shortest and base not in bases and self._part(base):
                            bases.append(base)
            if bases:
                index = self._index
                return next((b for b in bases if index is not None and b in index.words), bases[0])
        return None
