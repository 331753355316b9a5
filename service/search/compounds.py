"""Decompounding of a text query for the lexical channel (``store.text.decompound``): a query word of a
compounding language (German, Swedish, Dutch, Danish, Norwegian, Finnish) that the version's text never
writes whole, but that splits into known words whose last (the head) the text does write, is searched by
its parts too: "äppeljuice" finds "Äpple Juice", "grapefruktjuice" the text that writes "grapefrukt" and
"juice" apart.

Each such reading of the query (one per compounding language it is read as: ``service.search.hybrid``'s
readings) gets one more reading, the same terms with each split word's term replaced by its parts' terms.
The compound's own term stays in the first reading, so a catalogue that writes the compound still matches
it; the split reading is scored on its own in the term coverage features (``coverage`` and ``lexical``,
``store.products.hybrid``: the best-covered reading counts), where a product holding every part covers the
query as
one holding the compound would. BM25 searches the union of both readings' terms.

Known words: the version's vocabulary (``store.text.spelling.Vocabulary``, the words and stems of its text
values) and the language's wordfreq list (``service.search.dictionaries``: its "large" list where there is
one, each word written at least once in 10^8; wordfreq's code is Apache-2.0 and its data CC-BY-SA 4.0), so
a part the shop never writes ("grapefrukt" in a shop that writes "grapefruit") is still a word. One
``Decompounder`` per version and language, built on first use and dropped with the version; its splits are
cached.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

from service.search.dictionaries import QueryDictionaries
from store.products.channels import ProductChannels
from store.text.decompound import Decompounder, compounding


def _unknown(word: str) -> bool:
    return False


class QueryCompounds:
    """The decompounders of the served versions, per compounding language. Thread-safe; one per process (the
    pipeline's)."""

    def __init__(self, dictionaries: QueryDictionaries | None) -> None:
        self.dictionaries = dictionaries  # None: only the version's own words are known
        self._built: weakref.WeakKeyDictionary[ProductChannels, dict[str, Decompounder]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def of(self, channels: ProductChannels, lang: str | None) -> Decompounder | None:
        """``lang``'s decompounder for the version (built now on its first use), None where ``lang`` is not
        a compounding language or the version has no text."""
        code = compounding(lang)
        if code is None or channels.info.texts == 0:
            return None
        per_version = self._built.get(channels)
        if per_version is not None and code in per_version:
            return per_version[code]
        vocabulary = channels.vocabulary()  # built once per version, shared with typo tolerance
        dictionary = self.dictionaries.of(code) if self.dictionaries is not None else None
        built = Decompounder(code, dictionary.knows if dictionary is not None else _unknown, vocabulary)
        with self._lock:
            return self._built.setdefault(channels, {}).setdefault(code, built)

    def readings(
        self, channels: ProductChannels, text: str, languages: Sequence[str | None]
    ) -> list[list[str]]:
        """The split readings of ``text``, one for each compounding language of ``languages`` in which a
        word of it splits (first-seen order, duplicates dropped)."""
        found: list[list[str]] = []
        for lang in dict.fromkeys(languages):
            splitter = self.of(channels, lang)
            reading = splitter.reading(text) if splitter is not None else None
            if reading and reading not in found:
                found.append(reading)
        return found
