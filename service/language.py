"""A query's language as the service answers it: a request's hint, else ``store.text.language_id``'s detector
with the served catalogue's prior (``CatalogueLanguages``), as a ``LanguageInfo``.

The catalogue prior (issue 45): a shop's queries are mostly in the languages its catalogue writes, in its
words. So for a query on a version with product text,

- each language holding at least ``MIN_SHARE`` of the version's text values gains ``SHARE_BONUS``;
- each query word the version's text writes in a language (``store.text.spelling.Vocabulary``, which records
  the languages each word was written in) gains that language ``WORD_BONUS``.

Both are log-scores added to the detector's (a language's word-frequency evidence for one common word is
~10); they were set by reasoning, not fitted to a catalogue: a catalogue language wins a tie, and a query
word the catalogue writes in a language outweighs a slightly more frequent reading elsewhere ("soy yoghurt"
in an English grocery is English, not Spanish), while a query clearly in a language the shop does not write
stays in that language ("Apfelsaft" is German in a Swedish and English shop). Measured on the grocery
half (``bench/compound_queries.py``'s ``language_prior``): compound queries in twelve languages 0.924
detected with the prior or without (0.951 with, 0.944 without, after the detector's shinjitai, loan
modifiers, names and short-query rules); one-word product-type queries 0.759 with, 0.775 without: English and
Swedish gain 25 and 12 points, the other Latin-script languages lose 6-12 (a one-word query in a language
the shop does not write leans to one it does: "Gurke", "peras" read as English).

Detected languages are cached by (catalogue, text) (``cache_size``, CCRK_CACHE_SIZE): a repeated query (a
result-cache hit too, whose key holds the language) is not classified again (~0.2 ms of CPU).
"""

from __future__ import annotations

import itertools
import threading
import unicodedata
import weakref
from collections.abc import Mapping, Sequence

from cachetools import LRUCache

from service.schemas import LanguageInfo
from store.products.channels import ProductChannels
from store.text.language_id import Detected, Prior, normalise_code
from store.text.language_id import LanguageDetector as CoreDetector
from store.text.spelling import Vocabulary

MIN_SHARE = 0.05  # of a version's text values, from which their language is one of the catalogue's
SHARE_BONUS = 1.5  # log-score of a catalogue language
WORD_BONUS = 1.5  # log-score per query word the catalogue writes in a language

_SERIAL = itertools.count(1)


class CatalogueLanguages:
    """One served version's languages and vocabulary as a prior on a query's language (``Prior``)."""

    def __init__(self, language_counts: Mapping[str, int], vocabulary: Vocabulary | None) -> None:
        self.key = next(_SERIAL)  # names this catalogue in the detector's cache (unique in the process)
        counted = {lang: n for lang, n in language_counts.items() if lang not in ("und", "") and n > 0}
        total = sum(counted.values())
        self.languages = {
            lang: SHARE_BONUS for lang, n in sorted(counted.items()) if total and n / total >= MIN_SHARE
        }
        self._vocabulary = vocabulary

    def bias(self, words: Sequence[str]) -> Mapping[str, float]:
        out = dict(self.languages)
        if self._vocabulary is not None:
            for word in words:  # folded as the vocabulary folds (NFKC, case-folded)
                for lang in self._vocabulary.languages_of(unicodedata.normalize("NFKC", word)):
                    out[lang] = out.get(lang, 0.0) + WORD_BONUS
        return out


_CATALOGUES: weakref.WeakKeyDictionary[ProductChannels, CatalogueLanguages] = weakref.WeakKeyDictionary()
_CATALOGUES_LOCK = threading.Lock()


def catalogue_languages(channels: ProductChannels | None) -> CatalogueLanguages | None:
    """The prior of a served version's product channels (None: a version without product text), made on
    first use and kept while the version is (its vocabulary is the one typo tolerance reads)."""
    if channels is None or not channels.info.texts:
        return None
    with _CATALOGUES_LOCK:
        found = _CATALOGUES.get(channels)
    if found is None:
        found = CatalogueLanguages(channels.info.language_counts, channels.vocabulary())
        with _CATALOGUES_LOCK:
            found = _CATALOGUES.setdefault(channels, found)  # a race keeps the first
    return found


class LanguageDetector:
    """Thread-safe after construction (classification only reads the tables; the cache has a lock).

    ``params`` are the core detector's weights (tuning, the bench); ``cache_size``: detected languages of
    that many recent (catalogue, text) pairs are kept; 0: none.
    """

    def __init__(self, supported: Sequence[str], *, cache_size: int = 0, **params: float) -> None:
        self.core = CoreDetector(supported, **params)
        self.supported = self.core.supported
        self._cache: LRUCache[tuple[int, str], LanguageInfo] | None = (
            LRUCache(cache_size) if cache_size > 0 else None
        )
        self._cache_lock = threading.Lock()

    def hinted(self, hint: str) -> LanguageInfo:
        code = normalise_code(hint)
        return LanguageInfo(code=code, confidence=1.0, source="hint", supported=code in self.supported)

    def detect(self, text: str, catalogue: Prior | None = None) -> LanguageInfo:
        return info_of(self.core.detect(text, catalogue))

    def resolve(
        self, text: str, hint: str | None, catalogue: CatalogueLanguages | None = None
    ) -> LanguageInfo:
        if hint:
            return self.hinted(hint)
        if self._cache is None:
            return self.detect(text, catalogue)
        key = (catalogue.key if catalogue is not None else 0, text)
        with self._cache_lock:
            found = self._cache.get(key)
        if found is None:
            found = self.detect(text, catalogue)
            with self._cache_lock:
                self._cache[key] = found
        return found.model_copy()  # each answer its own (a cached one is never handed out to be changed)


def info_of(detected: Detected) -> LanguageInfo:
    return LanguageInfo(
        code=detected.code,
        confidence=detected.confidence,
        source="detected",
        supported=detected.supported,
        mixed=detected.mixed,
    )
