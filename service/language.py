"""Query language identification for short shop queries, offline; a hint overrides.

Three kinds of evidence, each where it is strong:

1. The writing system. Hangul is Korean, kana Japanese, Thai Thai, Greek Greek, Hebrew Hebrew, and so on:
   a query in such a script needs no statistics. Only scripts that several languages write (Latin, Cyrillic,
   Arabic, Devanagari, Han) go on to a choice between that script's languages.
2. Word frequencies (wordfreq's "small" lists, installed with the package: every word at or above one in a
   million tokens; 35 of its languages). Short queries are mostly common words ("a man", "tiga payung"), and
   whole-word frequencies tell languages apart where character n-grams cannot: py3langid alone put "A man"
   in Czech and "a set" in Indonesian.
3. py3langid's character n-gram scores, for words that the lists do not hold (inflected forms, rare words).

The scores of the script's languages add up (naive Bayes over words, plus the character scores at a tuned
weight, plus a prior that favours the model's own languages: a shop's queries come mostly in the languages it
serves) and are normalised into probabilities. The label is the most probable language, its probability the
confidence; close relatives of a supported language count for it (Malay for Indonesian, Slovak for Czech).
A query none of whose words the winning language knows gets at most ``UNKNOWN_WORDS_CONFIDENCE``: it is in a
language or a spelling the lists miss (romanised Hindi, Estonian), and the label is a guess.

Measured by bench/language_id.py (bench/results/language_id-2026-11-24.json) on held-out captions of the
synthetic catalogue (seed 123) and on Multi30K lines; the constants below were tuned on other data (synthetic
train captions of seed 7 and Multi30K train lines) by its ``--tune``.

Over 400 lines because the detector is one model read in one place: its tables, its evidence and weighing,
and the mixed-language check, which classifies a query's halves together with the query (it sits on every
text search's path: ~0.17-0.19 ms of CPU, the largest Python cost of a search after the HTTP layer).
"""

from __future__ import annotations

import functools
import math
import re
import string
import threading
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import regex
from cachetools import LRUCache
from py3langid.langid import MODEL_FILE, LanguageIdentifier, visit_counts

from service.schemas import LanguageInfo

# Close relatives the service treats as one market with a supported language: their probability counts for
# it, and they are never the label while it is supported.
RELATIVES = {"ms": "id", "sk": "cs"}

# Scripts written by one language (of those a shop sees): the script is the answer.
SCRIPT_LANGUAGE = {
    "HANGUL": "ko",
    "KANA": "ja",
    "THAI": "th",
    "GREEK": "el",
    "HEBREW": "he",
    "GEORGIAN": "ka",
    "ARMENIAN": "hy",
    "BENGALI": "bn",
    "TAMIL": "ta",
    "TELUGU": "te",
    "KANNADA": "kn",
    "MALAYALAM": "ml",
    "GUJARATI": "gu",
    "GURMUKHI": "pa",
    "ORIYA": "or",
    "SINHALA": "si",
    "KHMER": "km",
    "LAO": "lo",
    "MYANMAR": "my",
    "ETHIOPIC": "am",
    "TIBETAN": "bo",
}
# Scripts several languages write: the languages compared (py3langid codes). Latin and Cyrillic hold the
# languages with a word list plus a few widely used ones without (scored by characters alone).
# fmt: off
SCRIPT_CANDIDATES = {
    "LATIN": (
        "en", "de", "fr", "es", "it", "pt", "nl", "ca", "pl", "cs", "sk", "sl", "hr", "hu", "ro", "fi", "sv",
        "da", "no", "is", "lv", "lt", "tr", "id", "ms", "tl", "vi",
    ),
    "CYRILLIC": ("ru", "uk", "bg", "mk", "be", "sr", "kk"),
    "ARABIC": ("ar", "fa", "ur"),
    "DEVANAGARI": ("hi", "mr", "ne"),
    "HAN": ("zh", "ja"),
}
# fmt: on
# A supported language none of the above holds joins its script's group (Latin unless listed here), scored
# by characters alone: py3langid knows ~140 languages, wordfreq's lists 40.
OTHER_SCRIPT = (
    dict.fromkeys(("ky", "mn", "tg", "tt", "ba"), "CYRILLIC")
    | dict.fromkeys(("ps", "ug", "sdh", "ary", "arz"), "ARABIC")
    | dict.fromkeys(("sa", "gom"), "DEVANAGARI")
)
SCRIPTS = {*SCRIPT_LANGUAGE, *SCRIPT_CANDIDATES}
# Our code -> wordfreq's, where they differ (wordfreq's "sh" is Serbo-Croatian written in Latin letters).
WORDFREQ_CODE = {"hr": "sh", "no": "nb", "tl": "fil"}

# Tuned on synthetic train captions (seed 7) and Multi30K train lines: ``bench/language_id.py --tune``.
CHAR_WEIGHT = 0.5  # weight of py3langid's length-normalised character log-likelihood
OOV_LOG10 = -6.0  # log10 frequency of a word a language's list does not hold (the lists stop at 1e-6)
SUPPORTED_PRIOR = 2.0  # log prior odds of a supported language against an unsupported one
UNKNOWN_WORDS_CONFIDENCE = 0.45  # the most confidence a label gets when the query has no word it knows
MIXED_HALF_P = 0.9  # both halves of a query confidently in different languages -> "mixed"

_LN10 = math.log(10.0)
_DROP_ASCII_LETTERS = str.maketrans("", "", string.ascii_letters)  # an ASCII letter is what isalpha() says
_ASCII_WORD = re.compile(r"[a-z]+")
_WORD = regex.compile(r"[\p{L}\p{M}]+")  # letters with their combining marks (Devanagari vowel signs)


def normalise_code(code: str) -> str:
    """``EN``, ``en-US``, ``zh_Hans`` -> ``en``, ``en``, ``zh``."""
    return re.split(r"[-_]", code.strip(), maxsplit=1)[0].lower()


@functools.lru_cache(maxsize=8192)  # a name lookup per letter would be most of a query's cost
def _script(char: str) -> str:
    """Writing system of a letter: the first word of its Unicode name, Han and kana named as such."""
    name = unicodedata.name(char, "")
    if name.startswith(("CJK", "IDEOGRAPHIC")):
        return "HAN"
    if name.startswith(("HIRAGANA", "KATAKANA")):
        return "KANA"
    return name.split(" ", 1)[0]  # LATIN, CYRILLIC, GREEK, ARABIC, HANGUL, ...


def script_counts(text: str) -> Counter[str]:
    """Letters per writing system."""
    if text.isascii():  # the common case, without a Unicode name lookup per character
        letters = len(text) - len(text.translate(_DROP_ASCII_LETTERS))
        return Counter(LATIN=letters) if letters else Counter()
    return Counter(map(_script, filter(str.isalpha, text)))


def words(text: str) -> list[str]:
    """Case-folded words as the frequency lists hold them (apostrophes split, like wordfreq's ``l'homme``)."""
    if text.isascii():
        return _ASCII_WORD.findall(text.lower())
    return _WORD.findall(text.casefold())


class WordTable:
    """Word -> log10 frequency in each of ``languages``, from wordfreq's small lists.

    Stored as sorted 64-bit hashes (Python's ``hash``, so built in each process) and a sparse row per word:
    the ~1.4 million (word, language) pairs of the 35 lists take ~16 MB, against ~150 MB as dicts of strings.
    """

    def __init__(self, languages: Sequence[str]) -> None:
        import wordfreq  # only here: importing it pulls in ftfy, langcodes and regex tables

        self.languages = tuple(languages)
        available = wordfreq.available_languages("small")
        hashes, langs, centibels = [], [], []
        for index, code in enumerate(self.languages):
            # read_cBpack, not get_frequency_list: that one caches every list's strings for the process.
            # The list at index i holds the words of frequency 10 ** (-i / 100).
            buckets = wordfreq.read_cBpack(available[WORDFREQ_CODE.get(code, code)])
            sizes = [len(bucket) for bucket in buckets]
            hashes.append(
                np.fromiter((hash(w) for b in buckets for w in b), dtype=np.int64, count=sum(sizes))
            )
            centibels.append(np.repeat(np.arange(len(buckets), dtype=np.uint16), sizes))
            langs.append(np.full(sum(sizes), index, dtype=np.int16))
        all_hashes = np.concatenate(hashes)
        order = np.argsort(all_hashes, kind="stable")
        all_hashes = all_hashes[order]
        starts = np.flatnonzero(np.r_[True, all_hashes[1:] != all_hashes[:-1]])
        self._hashes = all_hashes[starts]
        self._bounds = np.r_[starts, len(all_hashes)].astype(np.int32)
        self._langs = np.concatenate(langs)[order]
        self._centibels = np.concatenate(centibels)[order]

    def totals(self, query_words: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Per language: the sum of the log10 frequencies of the words its list holds, and how many it holds
        (one ``searchsorted`` for all the words of a query)."""
        n = len(self.languages)
        keys = np.fromiter((hash(word) for word in query_words), dtype=np.int64, count=len(query_words))
        at = np.minimum(np.searchsorted(self._hashes, keys), len(self._hashes) - 1)
        hits = at[self._hashes[at] == keys]
        if not hits.size:
            return np.zeros(n), np.zeros(n)
        pairs, _ = self._pairs(hits)
        langs = self._langs[pairs]
        log10 = self._centibels[pairs] * -0.01
        return np.bincount(langs, weights=log10, minlength=n), np.bincount(langs, minlength=n)

    def _pairs(self, hits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The (word, language) pairs of the words at ``hits``, word by word in order (each word's run of
        ``_bounds``), and how many each word has."""
        starts, lengths = self._bounds[hits], self._bounds[hits + 1] - self._bounds[hits]
        ends = np.cumsum(lengths)
        return np.repeat(starts - (ends - lengths), lengths) + np.arange(int(ends[-1])), lengths

    def totals_matrix(self, lists: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """``totals`` of several word lists with one lookup (a query and its halves, ``LanguageDetector``) as
        two (lists, languages) matrices: the sums and how many words each list holds. Each list's sums are
        added in the same order as ``totals`` adds them, so they are the same."""
        n, g = len(self.languages), len(lists)
        flat = [word for words_ in lists for word in words_]
        keys = np.fromiter((hash(word) for word in flat), dtype=np.int64, count=len(flat))
        segment = np.repeat(np.arange(g), [len(words_) for words_ in lists])
        at = np.minimum(np.searchsorted(self._hashes, keys), len(self._hashes) - 1)
        found = self._hashes[at] == keys
        hits = at[found]
        if not hits.size:
            return np.zeros((g, n)), np.zeros((g, n))
        pairs, lengths = self._pairs(hits)
        cell = np.repeat(segment[found], lengths) * n + self._langs[pairs]
        log10 = self._centibels[pairs] * -0.01
        sums = np.bincount(cell, weights=log10, minlength=n * g).reshape(g, n)
        held = np.bincount(cell, minlength=n * g).reshape(g, n)
        return sums, held

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self._hashes, self._bounds, self._langs, self._centibels))


_TABLE: WordTable | None = None
_TABLE_LOCK = threading.Lock()


def word_table() -> WordTable:
    """The process's word table (built once, ~1 s; every detector shares it)."""
    global _TABLE
    with _TABLE_LOCK:
        if _TABLE is None:
            import wordfreq

            available = wordfreq.available_languages("small")
            codes = dict.fromkeys(c for group in SCRIPT_CANDIDATES.values() for c in group)
            _TABLE = WordTable(
                [c for c in codes if WORDFREQ_CODE.get(c, c) in available and c not in ("zh", "ja")]
            )
        return _TABLE


@dataclass(frozen=True)
class _Group:
    """The languages one script is decided among, as column indexes into the tables."""

    codes: tuple[str, ...]
    char_columns: np.ndarray  # py3langid columns
    word_columns: np.ndarray  # word table columns, -1 where the language has no list
    supported: np.ndarray  # counts for a supported language (itself or the relative it folds into)
    fold: np.ndarray  # index of the language each one counts for (itself, or its supported relative)
    log_family: np.ndarray  # log of how many languages count for that one (its prior is shared among them)
    has_list: np.ndarray  # word_columns >= 0


@dataclass(frozen=True)
class Evidence:
    """What a query says about each language of its script (the parts ``LanguageDetector`` weighs)."""

    char: np.ndarray  # py3langid's character log-likelihood over sqrt(bytes), as its norm_probs uses
    known_log10: np.ndarray  # sum of log10 frequencies of the words the language's list holds
    unknown: np.ndarray  # how many of the query's words the language's list lacks
    any_known: np.ndarray  # whether the list holds any of them (a language without a list: True)


class LanguageDetector:
    """Thread-safe after construction (classification only reads the tables; the cache has a lock).

    The keyword arguments exist for tuning and the bench; the service uses the module's constants, and
    ``cache_size`` (CCRK_CACHE_SIZE): detected languages of that many recent query texts are kept, so a
    repeated query (a result-cache hit too, whose key holds the language) is not classified again (~0.2 ms
    of CPU: the query and both its halves). 0: none kept.
    """

    def __init__(
        self,
        supported: Sequence[str],
        *,
        char_weight: float = CHAR_WEIGHT,
        oov_log10: float = OOV_LOG10,
        supported_prior: float = SUPPORTED_PRIOR,
        unknown_words_confidence: float = UNKNOWN_WORDS_CONFIDENCE,
        cache_size: int = 0,
    ) -> None:
        self.supported = tuple(dict.fromkeys(normalise_code(c) for c in supported))
        self._cache: LRUCache[str, LanguageInfo] | None = LRUCache(cache_size) if cache_size > 0 else None
        self._cache_lock = threading.Lock()
        self.char_weight, self.oov_log10 = char_weight, oov_log10
        self.supported_prior, self.unknown_words_confidence = supported_prior, unknown_words_confidence
        ident = LanguageIdentifier.from_model_file(MODEL_FILE)
        # The byte automaton that finds py3langid's features; its full table (~28 MB) is not kept.
        self._automaton = (ident.tk_nextmove, ident._rowbase, ident.tk_output)
        self._words = word_table()
        column: dict[str, int] = {}
        for i, code in enumerate(ident.nb_classes):
            column.setdefault(code, i)  # py3langid folds an alias column into the label's first one
        word_column = {code: i for i, code in enumerate(self._words.languages)}
        self._groups: dict[str, _Group] = {}
        listed = {c for group in SCRIPT_CANDIDATES.values() for c in group} | set(SCRIPT_LANGUAGE.values())
        extra = [c for c in self.supported if c in column and c not in listed]
        for script, group in SCRIPT_CANDIDATES.items():
            joining = [c for c in extra if OTHER_SCRIPT.get(c, "LATIN") == script]
            codes = tuple(c for c in (*group, *joining) if c in column)
            target = {c: RELATIVES.get(c, c) for c in codes}
            target = {c: t if t in self.supported and t in codes else c for c, t in target.items()}
            self._groups[script] = _Group(
                codes=codes,
                char_columns=np.array([column[c] for c in codes], dtype=np.intp),
                word_columns=np.array([word_column.get(c, -1) for c in codes], dtype=np.intp),
                supported=np.array([target[c] in self.supported for c in codes]),
                fold=np.array([codes.index(target[c]) for c in codes], dtype=np.intp),
                log_family=np.log([Counter(target.values())[target[c]] for c in codes]),
                has_list=np.array([word_column.get(c, -1) >= 0 for c in codes]),
            )
        # Per group, the first terms of every score (the prior, its share among a folded family), computed
        # as ``weigh`` computes them, by the prior in force (``bench/language_id.py --tune`` sets it on a
        # detector); and the bincount cells folding k rows at once.
        self._prior_terms: dict[tuple[str, float], np.ndarray] = {}
        self._fold_cells: dict[tuple[str, int], np.ndarray] = {}
        # py3langid's feature table (float16) restricted to each group's columns: the rows a query visits.
        self._char_tables = {
            script: np.ascontiguousarray(ident.nb_ptc[:, group.char_columns])
            for script, group in self._groups.items()
        }

    def hinted(self, hint: str) -> LanguageInfo:
        code = normalise_code(hint)
        return LanguageInfo(code=code, confidence=1.0, source="hint", supported=code in self.supported)

    def detect(self, text: str) -> LanguageInfo:
        counts = script_counts(text)
        if not counts:  # digits, symbols: no language to tell
            return LanguageInfo(code="und", confidence=0.0, source="detected", supported=False)
        # Han, kana and Hangul count as one (Japanese writes Han and kana together); letters outside the
        # scripts above (modifier letters such as Ukrainian's apostrophe ʼ) mix nothing.
        systems = {"HAN" if s in ("KANA", "HANGUL") else s for s in counts if s in SCRIPTS}
        halves = self._halves(text) if len(systems) <= 1 else None
        if halves is None:
            mixed = len(systems) > 1
            code, confidence = self.classify(text, counts)
        else:  # the query and its halves classified together (one word lookup, one walk of the first half)
            (code, confidence), first, second = self._classify_together([(text, counts), *halves])
            mixed = first[0] != second[0] and min(first[1], second[1]) >= MIXED_HALF_P
        return LanguageInfo(
            code=code,
            confidence=round(confidence, 4),
            source="detected",
            supported=code in self.supported,
            mixed=mixed,
        )

    def script(self, counts: Counter[str]) -> tuple[str, float]:
        """The script a query is decided by and the share of its letters that script (with Han, for
        Japanese and Korean) covers."""
        if len(counts) == 1:  # one writing system (the common case): it, all of the letters
            ((script, letters),) = counts.items()
            if letters:
                return script, 1.0
        total = sum(counts.values())
        if not total:  # no letters (digits, punctuation): nothing to tell
            return "und", 0.0
        if counts["KANA"]:  # kana are Japanese only, even beside many Han characters
            return "KANA", (counts["KANA"] + counts["HAN"]) / total
        if counts["HANGUL"]:
            return "HANGUL", (counts["HANGUL"] + counts["HAN"]) / total
        script = max(counts, key=lambda s: (s in SCRIPTS, counts[s]))
        return script, counts[script] / total

    def classify(self, text: str, counts: Counter[str] | None = None) -> tuple[str, float]:
        """(code, confidence) of a text with letters."""
        script, share = self.script(script_counts(text) if counts is None else counts)
        group = self._groups.get(script)
        if group is None:  # the script decides (or, one we do not know, leaves it undetermined)
            code = SCRIPT_LANGUAGE.get(script, "und")
            return code, share if code != "und" else 0.0
        probs, knows = self.weigh(self.evidence(text, script), group)
        best = int(probs.argmax())
        confidence = float(probs[best]) * share
        if not knows[best]:
            confidence = min(confidence, self.unknown_words_confidence)
        return group.codes[best], confidence

    def evidence(self, text: str, script: str) -> Evidence:
        """Character and word evidence for each language of the script's group."""
        encoded = LanguageIdentifier._encode(text)
        visits = visit_counts(*self._automaton, encoded)
        query_words = words(text) if script != "HAN" else []  # Chinese, Japanese: no spaces between words
        totals = self._words.totals(query_words) if query_words else None
        return self._evidence(script, visits, len(encoded), len(query_words), totals)

    def _evidence(
        self,
        script: str,
        visits: Counter[int] | None,
        encoded_bytes: int,
        n_words: int,
        totals: tuple[np.ndarray, np.ndarray] | None,
    ) -> Evidence:
        """``evidence`` from the DFA's feature counts (py3langid's ``visit_counts``) and the word table's
        ``totals`` of the text's words (None: no words)."""
        group = self._groups[script]
        n = len(group.codes)
        char = self._char(script, visits, encoded_bytes)
        has_list = group.word_columns >= 0
        if n_words and totals is not None:
            log_sum, held = totals
            known_log10 = np.where(has_list, log_sum[group.word_columns], 0.0)
            held_here = np.where(has_list, held[group.word_columns], 0)
            unknown = np.where(has_list, n_words - held_here, n_words).astype(np.float64)
            any_known = ~has_list | (held_here > 0)
        else:
            known_log10, unknown, any_known = np.zeros(n), np.zeros(n), np.ones(n, dtype=bool)
        return Evidence(char=char, known_log10=known_log10, unknown=unknown, any_known=any_known)

    def _char(self, script: str, visits: Counter[int] | None, encoded_bytes: int) -> np.ndarray:
        """py3langid's character log-likelihood of each language of the script's group over sqrt(bytes)."""
        if not visits:
            return np.zeros(len(self._groups[script].codes), dtype=np.float32)
        idx = np.fromiter(visits.keys(), dtype=np.intp, count=len(visits))
        counts = np.fromiter(visits.values(), dtype=np.float32, count=len(visits))
        rows = self._char_tables[script][idx].astype(np.float32)  # float16 as stored: no BLAS for it
        return (np.log1p(counts) @ rows) / math.sqrt(encoded_bytes)

    def _weigh_rows(
        self,
        script: str,
        char: np.ndarray,
        known_log10: np.ndarray,
        unknown: np.ndarray,
        any_known: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``weigh`` of several texts of one script at once, one row each (the same arithmetic, element by
        element and row by row)."""
        group = self._groups[script]
        k, n = char.shape
        prior = self._prior_terms.get((script, self.supported_prior))
        if prior is None:  # once per script and prior; a race only computes one twice
            prior = self.supported_prior * group.supported - group.log_family
            self._prior_terms[(script, self.supported_prior)] = prior
        scores = prior + self.char_weight * char + _LN10 * (known_log10 + self.oov_log10 * unknown)
        probs = np.exp(scores - scores.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        cells = self._fold_cells.get((script, k))
        if cells is None:  # a few per script (k is 1 to 3); a race only computes one twice
            cells = self._fold_cells[(script, k)] = (np.arange(k)[:, None] * n + group.fold).ravel()
        folded = np.bincount(cells, weights=probs.ravel(), minlength=k * n).reshape(k, n)
        knows = np.bincount(cells, weights=any_known.ravel(), minlength=k * n).reshape(k, n) > 0
        return folded, knows

    def weigh(self, evidence: Evidence, group: _Group) -> tuple[np.ndarray, np.ndarray]:
        """Probability of each language (relatives folded into the supported language they count for) and
        whether the language, or a relative folded into it, knows a word of the query."""
        # A folded family (Indonesian with Malay) shares one language's prior: on evidence that favours no
        # language it must not win twice as often.
        scores = (
            self.supported_prior * group.supported
            - group.log_family
            + self.char_weight * evidence.char
            + _LN10 * (evidence.known_log10 + self.oov_log10 * evidence.unknown)
        )
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        n = len(group.codes)
        folded = np.bincount(group.fold, weights=probs, minlength=n)
        knows = np.bincount(group.fold, weights=evidence.any_known, minlength=n) > 0
        return folded, knows

    def _mixed(self, text: str) -> bool:
        """Whether both halves of a query (by words) are confidently in different languages."""
        halves = self._halves(text)
        if halves is None:
            return False
        first, second = (self.classify(h, counts) for h, counts in halves)
        return first[0] != second[0] and min(first[1], second[1]) >= MIXED_HALF_P

    @staticmethod
    def _halves(text: str) -> list[tuple[str, Counter[str]]] | None:
        """A query's two halves (by words) with their letters per script, for the mixed-language check;
        None when it has fewer than 4 words or a half has no letters ("red cup 2 3": not two languages)."""
        parts = text.split()
        if len(parts) < 4:
            return None
        half = len(parts) // 2
        halves = [" ".join(parts[:half]), " ".join(parts[half:])]
        counts = [script_counts(h) for h in halves]
        if not all(counts):
            return None
        return list(zip(halves, counts, strict=True))

    def _classify_together(self, texts: list[tuple[str, Counter[str]]]) -> list[tuple[str, float]]:
        """``classify`` of each (text, letters per script), the same answers, with the work they share done
        once: one word-table lookup for all their words, and where the second text begins the first (a
        query's first half), the DFA's walk over it is the start of the first's walk."""
        scripts = [self.script(counts) for _, counts in texts]
        grouped = [i for i, (script, _) in enumerate(scripts) if script in self._groups]
        encoded = {i: LanguageIdentifier._encode(texts[i][0]) for i in grouped}
        visits: dict[int, Counter[int]] = {}
        if 0 in encoded and 1 in encoded and encoded[0].startswith(encoded[1]):
            first, state = self._walk(encoded[1])
            rest, _ = self._walk(encoded[0][len(encoded[1]) :], state)
            visits[1] = Counter(first)
            visits[0] = visits[1].copy()  # the same counts, in the same order, as counting first + rest
            visits[0].update(rest)
        for i in grouped:
            if i not in visits:
                visits[i] = Counter(self._walk(encoded[i])[0])
        word_lists = [words(texts[i][0]) if scripts[i][0] != "HAN" else [] for i in grouped]
        sums, held = self._words.totals_matrix(word_lists)
        out: list[tuple[str, float]] = []
        for script, share in scripts:
            code = SCRIPT_LANGUAGE.get(script, "und")  # the script decides, as in ``classify``
            out.append((code, share if code != "und" else 0.0))
        for script in dict.fromkeys(scripts[i][0] for i in grouped):  # the texts of one script together
            at = [j for j, i in enumerate(grouped) if scripts[i][0] == script]  # their rows in the totals
            group = self._groups[script]
            char = np.stack(
                [self._char(script, visits[grouped[j]] or None, len(encoded[grouped[j]])) for j in at]
            )
            n_words = np.array([len(word_lists[j]) for j in at])
            log_sum, held_rows = (sums, held) if len(at) == len(grouped) else (sums[at], held[at])
            has_list = group.has_list
            known_log10 = np.where(has_list, log_sum[:, group.word_columns], 0.0)
            held_here = np.where(has_list, held_rows[:, group.word_columns], 0)
            unknown = np.where(has_list, n_words[:, None] - held_here, n_words[:, None]).astype(np.float64)
            any_known = ~has_list | (held_here > 0)
            any_known[n_words == 0] = True  # no words: nothing any language fails to know (``_evidence``)
            probs, knows = self._weigh_rows(script, char, known_log10, unknown, any_known)
            for row, j in enumerate(at):
                i = grouped[j]
                best = int(probs[row].argmax())
                confidence = float(probs[row, best]) * scripts[i][1]
                if not knows[row, best]:
                    confidence = min(confidence, self.unknown_words_confidence)
                out[i] = (group.codes[best], confidence)
        return out

    def _walk(self, encoded: bytes, state: int = 0) -> tuple[list[int], int]:
        """py3langid's DFA walk (``visit_counts``) from ``state``: the features it emits, in order, and the
        state it ends in."""
        next_move, rowbase, output = self._automaton
        feats: list[int] = []
        append = feats.append
        for byte in encoded:
            state = next_move[rowbase[state] + byte]
            feature = output[state]
            if feature >= 0:
                append(feature)
        return feats, state

    def resolve(self, text: str, hint: str | None) -> LanguageInfo:
        if hint:
            return self.hinted(hint)
        if self._cache is None:
            return self.detect(text)
        with self._cache_lock:
            found = self._cache.get(text)
        if found is None:
            found = self.detect(text)
            with self._cache_lock:
                self._cache[text] = found
        return found.model_copy()  # each answer its own (a cached one is never handed out to be changed)
