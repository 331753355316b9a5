"""Query-language dictionaries for typo tolerance (``service.search.typos``): a query word that neither the
catalogue nor a dictionary of the query's language holds is corrected to that dictionary's nearest word, so
the multilingual (dense) channels encode "Äpfel" for "Äpcel" in a shop that writes only English and
Swedish, where the catalogue has no word to correct it to.

The dictionaries are wordfreq's word lists, installed with the package (code Apache-2.0, data CC-BY-SA
4.0; ``store.text.language_id`` reads the same lists for language identification):

- known words: the "large" list where wordfreq has one (21 languages, down to a frequency of 1e-8: the
  inflections and compounds a shop's queries hold), else the "small" one (1e-6), kept as sorted 64-bit
  hashes (~5 MB for German's 630k words);
- corrections: the "small" list's words of 5+ letters (~25-35k per language, each written at least once
  in a million words), in a tantivy fuzzy index in memory (``store.text.spelling.Vocabulary``: a Levenshtein
  automaton, a swap of neighbours one edit), chosen as ``nearest_in`` says;
- rarer corrections, asked only for a word none of the small list's is one edit from: the large list's
  other words of ``MIN_RARE`` letters and more written at least once in ``RARE_CENTIBELS`` (~75-230k per
  language). A shop's long words are mostly there, under the small list's cut: German and Dutch
  compounds ("sojajoghurt", "vruchtensap"), plurals ("citroenen", "ameixas"), produce ("sparris").

Each language's dictionary is built on first use, once per process (~0.2-0.5 s), by the
``QueryDictionaries`` the search pipeline owns, its rarer corrections on their own first use (~0.5-1.5 s);
nothing is read at import.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from store.text.language_id import SCRIPT_CANDIDATES, WORDFREQ_CODE, normalise_code, script_counts
from store.text.spelling import Vocabulary

# Correction candidates have as many letters as a word that may be corrected (typos.ONE_EDIT_FROM): a
# five-letter typo is not "corrected" by a deletion to a four-letter word ("milfh" to English "milf").
MIN_CANDIDATE = 5
# Rarer candidates: 7+ letters, as a shorter typo is one edit from many of the large list's rare words
# ("melien": 14 in German, "medien" to "meien"), and at least once in 10^7.5 words, the large list's
# upper half of its range (1e-6 to 1e-8): below that its words are mostly one-off spellings and names, and
# the cut halves the index (German: 230k words, not 485k) and a look-up's cost.
MIN_RARE = 7
RARE_CENTIBELS = 750
# Rows of a QWERTY keyboard (QWERTZ and AZERTY move only a few letters): a substituted letter next to the
# typed one is the commonest typo, so such a candidate goes before a more frequent one that is not.
_KEY_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")


def _key_neighbours() -> dict[str, str]:
    """Each letter's neighbours: beside it, and the two touching it in the rows above and below."""
    where = {(r, i): c for r, row in enumerate(_KEY_ROWS) for i, c in enumerate(row)}
    spots = ((0, -1), (0, 1), (-1, 0), (-1, 1), (1, -1), (1, 0))
    return {
        c: "".join(where[(r + dr, i + di)] for dr, di in spots if (r + dr, i + di) in where)
        for (r, i), c in where.items()
    }


KEY_NEIGHBOURS = _key_neighbours()


def is_key_slip(typed: str, word: str) -> bool:
    """Whether ``word`` is ``typed`` with one letter replaced by a key next to it."""
    if len(typed) != len(word):
        return False
    diff = [(a, b) for a, b in zip(typed, word, strict=True) if a != b]
    return len(diff) == 1 and diff[0][1] in KEY_NEIGHBOURS.get(diff[0][0], "")


@dataclass(frozen=True)
class DictionaryWord:
    """A dictionary word a typed word is corrected to."""

    word: str
    lang: str
    edits: int
    centibels: int  # -100 * log10 of its frequency in ``lang``: lower is more frequent


class Dictionary:
    """One language's known words and its fuzzy index of correction candidates (read-only; thread-safe)."""

    def __init__(
        self,
        lang: str,
        known: Iterable[str],
        candidates: dict[str, int],
        rare: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.lang = lang
        hashes = np.fromiter((hash(w) for w in known), dtype=np.int64)
        self._known = np.unique(hashes)
        self._centibels = candidates  # word -> centibels
        # Vocabulary keeps the largest count: the most frequent word has the least centibels.
        self._fuzzy = Vocabulary({w: 10_000 - cb for w, cb in candidates.items()}, {})
        # The rarer candidates (word -> centibels), read when first asked for: most queries never are.
        self._rare_source = rare
        self._rare: tuple[Vocabulary, dict[str, int]] | None = None
        self._lock = threading.Lock()

    @classmethod
    def of_wordfreq(cls, lang: str) -> Dictionary:
        import wordfreq  # only here: importing it pulls in ftfy, langcodes and regex tables

        code = WORDFREQ_CODE.get(lang, lang)
        small = wordfreq.read_cBpack(wordfreq.available_languages("small")[code])
        large_path = wordfreq.available_languages("large").get(code)
        large = wordfreq.read_cBpack(large_path) if large_path else small
        candidates = {
            w: cb
            for cb, bucket in enumerate(small)
            for w in bucket
            if w.isalpha() and len(w) >= MIN_CANDIDATE
        }

        def rare() -> dict[str, int]:
            if large_path is None:  # no large list: the small one is all there is
                return {}
            buckets = wordfreq.read_cBpack(large_path)[:RARE_CENTIBELS]
            return {
                w: cb
                for cb, bucket in enumerate(buckets)
                for w in bucket
                if len(w) >= MIN_RARE and w not in candidates and w.isalpha()
            }

        return cls(lang, (w for bucket in large for w in bucket), candidates, rare)

    def knows(self, word: str) -> bool:
        at = int(np.searchsorted(self._known, hash(word)))
        return at < self._known.size and int(self._known[at]) == hash(word)

    def within(self, word: str, edits: int) -> list[DictionaryWord]:
        """The candidates exactly ``edits`` from ``word`` (nearer ones are asked for first)."""
        return [
            DictionaryWord(w, self.lang, edits, self._centibels[w])
            for w in self._fuzzy.within(word, edits)
            if w != word
        ]

    def rare_within(self, word: str) -> list[DictionaryWord]:
        """The rarer candidates one edit from ``word`` (its index built now if this is its first use)."""
        if self._rare is None:
            with self._lock:  # one build per dictionary (~0.5-1.5 s, once)
                if self._rare is None:
                    words = self._rare_source() if self._rare_source is not None else {}
                    self._rare = (Vocabulary({w: 10_000 - cb for w, cb in words.items()}, {}), words)
        fuzzy, centibels = self._rare
        return [DictionaryWord(w, self.lang, 1, centibels[w]) for w in fuzzy.within(word, 1) if w != word]

    @property
    def nbytes(self) -> int:
        return int(self._known.nbytes)


class QueryDictionaries:
    """The dictionaries of the languages a query may be in: the model's (``languages``) with a wordfreq
    list, each built on first use and then kept for the process. Thread-safe."""

    def __init__(self, languages: Sequence[str]) -> None:
        self.languages = tuple(dict.fromkeys(normalise_code(c) for c in languages))
        self._built: dict[str, Dictionary | None] = {}
        self._lock = threading.Lock()
        self._available: frozenset[str] | None = None

    def has(self, lang: str) -> bool:
        if self._available is None:
            import wordfreq

            small = wordfreq.available_languages("small")
            self._available = frozenset(c for c in SCRIPT_LANGUAGES if WORDFREQ_CODE.get(c, c) in small)
        return lang in self._available

    def of(self, lang: str) -> Dictionary | None:
        """``lang``'s dictionary (built now if this is its first use), None where wordfreq has none."""
        found = self._built.get(lang, False)
        if found is not False:
            return found  # type: ignore[return-value]
        with self._lock:  # one build per language; a build holds the lock (~0.2-0.5 s, once)
            if lang not in self._built:
                self._built[lang] = Dictionary.of_wordfreq(lang) if self.has(lang) else None
            return self._built[lang]

    def for_word(self, word: str, languages: Sequence[str]) -> list[Dictionary]:
        """The dictionaries of ``languages`` written in ``word``'s script (a Latin word is never looked up in
        Russian)."""
        counts = script_counts(word)
        if len(counts) != 1:
            return []
        (script,) = counts
        writes = SCRIPT_CANDIDATES.get(script, ())
        return [d for lang in languages if lang in writes and (d := self.of(lang)) is not None]


# The languages whose word lists hold words of a shared script (CJK are never corrected: their words are
# bigrams, matched as written).
SCRIPT_LANGUAGES = frozenset(
    c for script, group in SCRIPT_CANDIDATES.items() if script != "HAN" for c in group
)


def nearest_in(
    word: str,
    dictionaries: Sequence[Dictionary],
    max_edits: int,
    catalogue: frozenset[str] | set[str] | dict[str, int] = frozenset(),
) -> DictionaryWord | None:
    """The dictionary word nearest ``word`` within ``max_edits``, over every dictionary: fewest edits (a rarer
    candidate one edit away where no common one is, before any two away), then one the catalogue writes
    too, then one a slip to a neighbouring key explains, then the most frequent (then the earlier
    dictionary, then code-point order); None where ``word`` is a word of one of them or none is near
    enough."""
    if any(d.knows(word) for d in dictionaries):
        return None
    for edits in range(1, max_edits + 1):
        found = [c for d in dictionaries for c in d.within(word, edits)]
        if not found and edits == 1 and len(word) >= MIN_RARE - 1:  # one insertion from 7 letters
            found = [c for d in dictionaries for c in d.rare_within(word)]
        if found:
            order = {d.lang: i for i, d in enumerate(dictionaries)}
            return min(
                found,
                key=lambda c: (
                    c.word not in catalogue,
                    not is_key_slip(word, c.word),
                    c.centibels,
                    order[c.lang],
                    c.word,
                ),
            )
    return None
