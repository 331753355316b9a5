"""Language identification of short text, offline: what the service reads a query's language with
(``service.language`` adds a request's hint and the served catalogue's prior) and what a build reads an
untagged text value's language with (``indexer.products``: each value with its field's language as prior).
It returns its own small ``Detected``; the service turns it into its response schema.

The evidence, each kind where it is strong:

1. The writing system. Hangul is Korean, kana Japanese, Thai Thai, Greek Greek, Hebrew Hebrew, and so on:
   a text in such a script needs no statistics; so is a Han text holding a shinjitai (``SHINJITAI``: a
   Japanese character form neither Chinese standard writes, 発 for 发 / 發). Only scripts that several
   languages write (Latin, Cyrillic, Arabic, Devanagari, Han) go on to a choice between that script's
   languages.
2. Word frequencies (wordfreq's "small" lists, installed with the package: every word at or above one in a
   million tokens; 35 of its languages). Short queries are mostly common words ("a man", "tiga payung"), and
   whole-word frequencies tell languages apart where character n-grams cannot: py3langid alone put "A man"
   in Czech and "a set" in Indonesian. Three refinements for shop queries (issue 45):

   - a compound of a compounding language (sv, da, no, de, nl) that its list lacks but whose 2 or 3 parts
     it holds ("havremjölk" = havre + mjölk, "äppeljuice" = äppel- (äpple) + juice, "Orangensaft" =
     Orange + n + Saft) is a word of that language, its log10 frequency the sum of its parts' plus
     ``COMPOUND_JOIN`` per join, at most the lists' floor (the list lacks it): the lists hold few of the
     compounds a shop sells, and none of them a language that does not compound; a split into rare parts
     ("apel" + "sin" + "juice" in Dutch) stays below an unknown word, and English loans the lists hold
     ("girls" in Dutch text) are no heads; a modifier may be an English word ("Grapefruitsaft" =
     grapefruit + Saft), counted at its English frequency, the head deciding the language;
   - a word a language's list lacks costs it ``OOV_LOG10`` less ``OOV_PER_LETTER`` for each letter beyond
     ``OOV_FREE_LETTERS``: the lists stop at one in a million, and a long word is less likely a rare word
     missing from a list than a word of another language ("vattenmelon" is no Dutch word);
   - a word English's list holds together with at least ``INTERNATIONAL_LISTS`` other lists ("laptop",
     "juice", "jeans": loanwords, whose frequency in another language's corpus says little) adds
     ``INTERNATIONAL_PRIOR`` to English; but such a word ten times as frequent in English as in the other
     served languages (supported or the prior's), beside a word of one of them that English lacks in a
     two-word text, is a name ("Birne Conference": the pear) and left out of every kind of evidence.
3. py3langid's character n-gram scores, for words that the lists do not hold (inflected forms, rare words).
4. A prior from where the text comes (``Prior``): the served catalogue's languages and vocabulary for a
   query (``service.language.CatalogueLanguages``), the field's language for a build's text value.

The scores of the script's languages add up (naive Bayes over words, plus the character scores at a tuned
weight, plus a prior that favours the supported languages: a shop's queries come mostly in the languages it
serves, plus the prior of the text's source) and are normalised into probabilities. The label is the most
probable language, its probability the confidence (on a short query, a supported language that knows as
many of its words as a likelier language neither supported nor the prior's: "melón galia" is Spanish, not
Lithuanian); close relatives of a supported language count for it
(Malay for Indonesian, Slovak for Czech). A text none of whose words the winning language knows gets at
most ``UNKNOWN_WORDS_CONFIDENCE``: it is in a language or a spelling the lists miss (romanised Hindi,
Estonian), and the label is a guess.

Measured by bench/language_id.py (bench/results/language_id-2026-12-02.json) on held-out captions of the
synthetic catalogue (seed 123) and on Multi30K lines; the constants below were tuned on other data (synthetic
train captions of seed 7 and Multi30K train lines) by its ``--tune``, or set as their comments say.

Over 400 lines because the detector is one model read in one place: its tables, its evidence (compounds
included) and weighing, and the mixed-language check, which classifies a query's halves together with the
query (it sits on every text search's path: ~0.2 ms of CPU, the largest Python cost of a search after the
HTTP layer).
"""

from __future__ import annotations

import functools
import math
import re
import string
import threading
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import regex
from py3langid.langid import MODEL_FILE, LanguageIdentifier

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
# Issue 45's evidence, none of it fitted to a shop's catalogue. The per-letter cost is set by design: the
# lists stop at 1e-6 and most long words are rarer still (the tuning data has no long shop words; there it
# costs the worst language's 2-word queries 0.2 points, 98.14 -> 97.93 %, and cuts confident wrong labels
# of left-out languages 0.30 -> 0.21 %). English's prior: ``--tune issue45``, the largest of the grid no
# worse on the tuning figures than none (0.35 and up give left-out languages more confident wrong labels).
OOV_PER_LETTER = 0.25  # log10 frequency an unknown word loses per letter beyond OOV_FREE_LETTERS
OOV_FREE_LETTERS = 4
INTERNATIONAL_PRIOR = 0.2  # log-score English gains per word it shares with INTERNATIONAL_LISTS others
INTERNATIONAL_LISTS = 5
INTERNATIONAL_LETTERS = 4  # the least letters of such a word (every list holds "a", "t", "in")

# Compounding languages, and how their compounds are split: 2 parts of at least COMPOUND_PART letters or 3
# of at least THREE_PART_LETTERS (a 3-letter word is as often a particle or a list's junk as a noun: "nen",
# "din", "hoe"; three short parts split most long words), each a word of the language's list and no English
# loan (LOAN_LOG10), a linking morpheme allowed after a part that is not the last (Orange-n-saft,
# jordgubb-s-yoghurt), and a first or middle part's compound form (a final -e or -a dropped:
# Erdbeer(e)-joghurt, flick(a)-skola; Swedish -le written -el: äppel- for äpple).
COMPOUND_LANGUAGES = ("sv", "da", "no", "de", "nl")
COMPOUND_LETTERS = (6, 30)
COMPOUND_PART = 3
THREE_PART_LETTERS = 4
# log10 a compound gains per join over the product of its parts' frequencies: two parts of 1e-5 make a word
# at the lists' floor (1e-6), which caps it (a word a list lacks is rarer than that). Set so, not tuned.
COMPOUND_JOIN = 4.0
LOAN_PART_LETTERS = 4  # the least letters of an English loan as a modifier (as THREE_PART_LETTERS, by design)
LOAN_LOG10 = 1.0  # a part ten times as frequent in English as in the language is an English loan there
LINKS = ("", "s", "e", "n", "en", "er", "es")
SPLIT_CACHE = 65536  # words whose splits are kept (a split costs ~0.1 ms; a shop's queries repeat words)

# A short query (at most SHORT_QUERY_WORDS words) is not labelled with a language that is neither supported
# nor named by the text's prior when a supported language knows as many of its words: "melón galia" is
# Spanish, not Lithuanian ("galia": "power"), a shop's queries are in the languages it serves. Set by design.
SHORT_QUERY_WORDS = 3
# A name is left out of a text of NAME_QUERY_WORDS words, a name and a word ("Birne Conference"): in longer
# text (a product title's half, "Smooth Style Utan") the English words are as often the text's own. By design.
NAME_QUERY_WORDS = 2
# Shinjitai: the Japanese forms of characters that Simplified and Traditional Chinese write otherwise (each
# with its Simplified / Traditional form, from the Joyo kanji's reformed forms; only characters neither
# Chinese standard writes, so no Chinese text holds one). A Han-only text holding one is Japanese, as a text
# with kana is; the table holds the commonest (shop words among them: 塩 salt, 麺 noodles, 鶏 chicken).
# fmt: off
SHINJITAI = {
    "亜": "亚亞", "圧": "压壓", "悪": "恶惡", "営": "营營", "駅": "驿驛", "円": "圆圓", "価": "价價",
    "壊": "坏壞", "拡": "扩擴", "楽": "乐樂", "巻": "卷捲", "関": "关關", "歓": "欢歡",
    "気": "气氣", "挙": "举舉", "経": "经經", "軽": "轻輕", "鶏": "鸡雞",
    "険": "险險", "県": "县縣", "験": "验驗", "広": "广廣", "鉱": "矿礦", "黒": "黑", "済": "济濟",
    "剤": "剂劑", "桜": "樱櫻", "児": "儿兒", "従": "从從", "渋": "涩澀", "獣": "兽獸", "縦": "纵縱",
    "焼": "烧燒", "乗": "乘", "浄": "净淨", "譲": "让讓", "醸": "酿釀", "図": "图圖",
    "粋": "粹", "穂": "穗", "帯": "带帶", "単": "单單", "団": "团團", "弾": "弹彈",
    "遅": "迟遲", "鋳": "铸鑄", "鉄": "铁鐵", "転": "转轉", "伝": "传傳", "闘": "斗鬥",
    "読": "读讀", "発": "发發", "抜": "拔", "売": "卖賣", "変": "变變",
    "歩": "步", "満": "满滿", "薬": "药藥", "訳": "译譯", "様": "样樣", "謡": "谣謠",
    "両": "两兩", "緑": "绿綠", "労": "劳勞", "録": "录錄",
    "塩": "盐鹽", "麺": "面麵", "醤": "酱醬", "蔵": "藏", "続": "续續", "総": "总總", "絵": "绘繪",
    "戦": "战戰", "択": "择擇", "沢": "泽澤", "隠": "隐隱", "顔": "颜顏", "歳": "岁歲", "斎": "斋齋",
}
# fmt: on

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


@dataclass(frozen=True)
class Detected:
    """A text's language: its code (``und`` where nothing could be told), the confidence, whether it is one
    of the detector's supported languages, and whether the text seems to mix languages or scripts."""

    code: str
    confidence: float
    supported: bool
    mixed: bool = False


class Prior(Protocol):
    """What a text's source says of its language: log-score added to each language named (the others 0)."""

    def bias(self, words: Sequence[str]) -> Mapping[str, float]:
        """The bonus of each language for a text of these words (``words``' folding)."""
        ...


@dataclass(frozen=True)
class FixedPrior:
    """The same bonus whatever the words (a build's field language)."""

    languages: Mapping[str, float]

    def bias(self, words: Sequence[str]) -> Mapping[str, float]:
        return self.languages


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
        """Per language: the sum of the log10 frequencies of the words its list holds, and how many."""
        table = self.matrix(query_words)
        held = ~np.isnan(table)
        return np.where(held, table, 0.0).sum(axis=0), held.sum(axis=0)

    def matrix(self, query_words: Sequence[str]) -> np.ndarray:
        """(words, languages) log10 frequencies, NaN where a language's list lacks the word (one
        ``searchsorted`` for all the words)."""
        every = np.arange(len(self.languages), dtype=np.intp)
        return self.columns(query_words, every, len(self.languages))[0]

    def columns(
        self, query_words: Sequence[str], column_of: np.ndarray, width: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``matrix`` into ``width`` columns, language i's in column ``column_of[i]`` (``width``: left
        out), and how many lists hold each word."""
        w = len(query_words)
        out = np.full((w, width + 1), np.nan)
        lists = np.zeros(w, dtype=np.int64)
        if w:
            keys = np.fromiter((hash(word) for word in query_words), dtype=np.int64, count=w)
            at = np.minimum(np.searchsorted(self._hashes, keys), len(self._hashes) - 1)
            found = self._hashes[at] == keys
            hits = at[found]
            if hits.size:
                starts, lengths = self._bounds[hits], self._bounds[hits + 1] - self._bounds[hits]
                ends = np.cumsum(lengths)
                pairs = np.repeat(starts - (ends - lengths), lengths) + np.arange(int(ends[-1]))
                rows = np.repeat(np.flatnonzero(found), lengths)
                out[rows, column_of[self._langs[pairs]]] = self._centibels[pairs] * -0.01
                lists[found] = lengths
        return out[:, :width], lists

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


def _modifier_forms(part: str) -> tuple[str, ...]:
    """The words a first or middle part of a compound may stand for: itself, with a dropped final -e or -a,
    and Swedish -el for -le."""
    forms = [part, part + "e", part + "a"]
    if part.endswith("el"):
        forms.append(part[:-2] + "le")
    return tuple(forms)


def _parts_log10(word: str, spans: Sequence[tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
    """The spans of ``word`` that are words of a compounding language, each with its log10 frequency per
    language of ``compound_log10`` (NaN: not one of its words): a span ending the word as written, any
    other by its best modifier form (one lookup for all)."""
    table = word_table()
    columns = _split_columns()
    strings: dict[str, int] = {}
    rows = np.full((len(spans), 4), -1, dtype=np.intp)  # each span's forms; -1: the NaN row below
    n = len(word)
    # A head is read as written; a loan modifier needs LOAN_PART_LETTERS ("bra" + "une" is no Dutch word).
    native_only = np.array([j == n or j - i < LOAN_PART_LETTERS for i, j in spans], dtype=bool)
    for at, (i, j) in enumerate(spans):
        part = word[i:j]
        for f, form in enumerate((part,) if j == n else _modifier_forms(part)):
            rows[at, f] = strings.setdefault(form, len(strings))
    c = len(COMPOUND_LANGUAGES)
    logs, _ = table.columns(list(strings), columns, c + 1)  # the compounding languages, then English
    # An English word the language's text holds as a loan ("girls", "players") is no part of its compounds:
    # wordfreq's lists of every language hold English, and "schoolgirls" is no Dutch compound.
    # A modifier may be one ("Grapefruitsaft", "grapefruitsap", "Mandarinensaft"): then the head, a word of
    # the language, carries the split, the loan counted at its English frequency.
    english = logs[:, c : c + 1]
    loans = english - logs[:, :c] > LOAN_LOG10
    native = np.vstack([np.where(loans, np.nan, logs[:, :c]), np.full((1, c), np.nan)])
    # A loan as written: English drops no -e in a compound ("bicycl" + "ist" is no German word).
    loaned = np.vstack([np.where(np.isnan(native[:-1]), english, native[:-1]), native[-1:]])
    by_span = np.fmax.reduce(native[rows], axis=1)  # (spans, languages): the best form of each
    by_span = np.where(native_only[:, None], by_span, np.fmax(by_span, loaned[rows[:, 0]]))
    return {spans[at]: by_span[at] for at in np.flatnonzero(~np.isnan(by_span).all(axis=1)).tolist()}


@functools.lru_cache(maxsize=1)
def _split_columns() -> np.ndarray:
    """Word table column -> index in ``COMPOUND_LANGUAGES``, English after them, any other language after
    English (left out)."""
    order = [*COMPOUND_LANGUAGES, "en"]
    return np.array(
        [order.index(c) if c in order else len(order) for c in word_table().languages], dtype=np.intp
    )


@functools.lru_cache(maxsize=SPLIT_CACHE)
def compound_log10(word: str) -> tuple[float, ...] | None:
    """Per language of ``COMPOUND_LANGUAGES`` (NaN where the word table lacks its list): the log10
    frequency of ``word`` as the best of its splits into 2 or 3 words of that language (the parts' sum plus
    ``COMPOUND_JOIN`` per join; NaN: no split); None where no language splits it. ``word`` folded as
    ``words`` folds it. The first parts and the last are looked up first, the middle parts of 3-part
    splits only between a known first part and a known last one. Capped at ``OOV_LOG10``."""
    n, low = len(word), COMPOUND_PART
    if not COMPOUND_LETTERS[0] <= n <= COMPOUND_LETTERS[1]:
        return None

    def link_ends(j: int) -> list[int]:
        """Where the next part may start after a part ending at ``j`` (a linking morpheme between)."""
        return [j + len(link) for link in LINKS if word.startswith(link, j)]

    ends = range(low, n - low + 1)
    known = _parts_log10(word, [(0, j) for j in ends] + [(k, n) for k in ends])
    firsts = [j for j in ends if (0, j) in known]
    lasts = {k for k in ends if (k, n) in known}
    found: np.ndarray | None = None
    middles: list[tuple[int, int, int, int]] = []  # (first's end, middle's start, middle's end, last's start)
    for j in firsts:
        for k in link_ends(j):
            if k in lasts:  # two parts
                split = known[(0, j)] + known[(k, n)] + COMPOUND_JOIN
                found = split if found is None else np.fmax(found, split)
            if j < THREE_PART_LETTERS:
                continue
            middles += [
                (j, k, m, p)
                for m in range(k + THREE_PART_LETTERS, n - THREE_PART_LETTERS + 1)
                for p in link_ends(m)
                if p in lasts and n - p >= THREE_PART_LETTERS
            ]
    if middles:
        known_middles = _parts_log10(word, list(dict.fromkeys((k, m) for _, k, m, _ in middles)))
        for j, k, m, p in middles:
            if (k, m) in known_middles:  # three parts
                split = known[(0, j)] + known_middles[(k, m)] + known[(p, n)] + 2 * COMPOUND_JOIN
                found = split if found is None else np.fmax(found, split)
    if found is None or np.isnan(found).all():
        return None
    # A word its language's list lacks is rarer than the list's floor, however frequent its parts.
    return tuple(float(x) for x in np.minimum(found, OOV_LOG10))


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
    no_list: np.ndarray  # ~has_list
    english: np.ndarray  # 1.0 at English, 0.0 elsewhere
    split_columns: np.ndarray  # the group's indexes of the compounding languages it holds with a list
    split_order: np.ndarray  # their indexes in ``COMPOUND_LANGUAGES`` (``compound_log10``'s answers)
    index: Mapping[str, int]  # code -> its index
    from_table: np.ndarray  # word table column -> the group's index (len(codes): not in the group)


@dataclass(frozen=True)
class Evidence:
    """What a text says about each language of its script (the parts ``LanguageDetector`` weighs): arrays
    over the group's languages, one row per text (``weigh`` takes one row, ``_weigh_rows`` several)."""

    char: np.ndarray  # py3langid's character log-likelihood over sqrt(bytes), as its norm_probs uses
    known_log10: np.ndarray  # sum of log10 frequencies of the words the language knows (listed, compounds)
    unknown: np.ndarray  # how many of the text's words the language lacks (neither listed nor a compound)
    known_words: np.ndarray  # how many it knows (words neutral as names, ``_names``, neither)
    known_masks: np.ndarray  # which it knows, bit i for word i, of a text of SHORT_QUERY_WORDS (else 0)
    any_known: np.ndarray  # whether it knows any of them (a language without a list: True)
    long_letters: np.ndarray  # letters beyond OOV_FREE_LETTERS of the words it lacks, summed
    international: np.ndarray  # the text's words English shares with INTERNATIONAL_LISTS other lists
    bias: np.ndarray  # the text's prior (``Prior.bias``) per language


class LanguageDetector:
    """Thread-safe after construction (classification only reads the tables).

    The keyword arguments exist for tuning and the bench; the service and the build use the module's
    constants.
    """

    def __init__(
        self,
        supported: Sequence[str],
        *,
        char_weight: float = CHAR_WEIGHT,
        oov_log10: float = OOV_LOG10,
        supported_prior: float = SUPPORTED_PRIOR,
        unknown_words_confidence: float = UNKNOWN_WORDS_CONFIDENCE,
        oov_per_letter: float = OOV_PER_LETTER,
        international_prior: float = INTERNATIONAL_PRIOR,
    ) -> None:
        self.supported = tuple(dict.fromkeys(normalise_code(c) for c in supported))
        self.char_weight, self.oov_log10 = char_weight, oov_log10
        self.supported_prior, self.unknown_words_confidence = supported_prior, unknown_words_confidence
        self.oov_per_letter = oov_per_letter
        self.international_prior = international_prior
        ident = LanguageIdentifier.from_model_file(MODEL_FILE)
        # The byte automaton that finds py3langid's features; its full table (~28 MB) is not kept.
        self._automaton = (ident.tk_nextmove, ident._rowbase, ident.tk_output)
        self._words = word_table()
        column: dict[str, int] = {}
        for i, code in enumerate(ident.nb_classes):
            column.setdefault(code, i)  # py3langid folds an alias column into the label's first one
        word_column = {code: i for i, code in enumerate(self._words.languages)}
        splitting = [c for c in COMPOUND_LANGUAGES if c in word_column]
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
                no_list=np.array([word_column.get(c, -1) < 0 for c in codes]),
                english=np.array([c == "en" for c in codes], dtype=np.float64),
                split_columns=np.array([codes.index(c) for c in splitting if c in codes], dtype=np.intp),
                split_order=np.array(
                    [COMPOUND_LANGUAGES.index(c) for c in splitting if c in codes], dtype=np.intp
                ),
                index={c: i for i, c in enumerate(codes)},
                from_table=np.array(
                    [codes.index(c) if c in codes else len(codes) for c in self._words.languages],
                    dtype=np.intp,
                ),
            )
        # Per group, the first terms of every score (the prior, its share among a folded family), by the
        # prior in force (``bench/language_id.py --tune`` sets it on a detector); and the bincount cells
        # folding k rows at once.
        self._prior_terms: dict[tuple[str, float], np.ndarray] = {}
        self._fold_cells: dict[tuple[str, int], np.ndarray] = {}
        # py3langid's feature table (float16) restricted to each group's columns: the rows a query visits.
        self._char_tables = {
            script: np.ascontiguousarray(ident.nb_ptc[:, group.char_columns])
            for script, group in self._groups.items()
        }

    def detect(self, text: str, prior: Prior | None = None) -> Detected:
        counts = script_counts(text)
        if not counts:  # digits, symbols: no language to tell
            return Detected(code="und", confidence=0.0, supported=False)
        # Han, kana and Hangul count as one (Japanese writes Han and kana together); letters outside the
        # scripts above (modifier letters such as Ukrainian's apostrophe ʼ) mix nothing.
        systems = {"HAN" if s in ("KANA", "HANGUL") else s for s in counts if s in SCRIPTS}
        halves = self._halves(text) if len(systems) <= 1 else None
        if halves is None:
            mixed = len(systems) > 1
            code, confidence = self.classify(text, counts, prior)
        else:  # the query and its halves classified together (one word lookup, one walk of the first half)
            (code, confidence), first, second = self._classify_together([(text, counts), *halves], prior)
            mixed = first[0] != second[0] and min(first[1], second[1]) >= MIXED_HALF_P
        return Detected(
            code=code, confidence=round(confidence, 4), supported=code in self.supported, mixed=mixed
        )

    def script(self, counts: Counter[str]) -> tuple[str, float]:
        """The script a text is decided by and the share of its letters that script (with Han, for
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

    def classify(
        self, text: str, counts: Counter[str] | None = None, prior: Prior | None = None
    ) -> tuple[str, float]:
        """(code, confidence) of a text with letters."""
        return self._classify_together([(text, script_counts(text) if counts is None else counts)], prior)[0]

    def evidence(self, text: str, script: str, prior: Prior | None = None) -> Evidence:
        """Character and word evidence for each language of the script's group (one row)."""
        encoded = LanguageIdentifier._encode(text)
        visits = Counter(self._walk(encoded)[0])
        word_lists = [words(text) if script != "HAN" else []]  # Chinese, Japanese: no spaces between words
        return self._evidence(script, [visits], [len(encoded)], word_lists, prior)

    def _evidence(
        self,
        script: str,
        visits: Sequence[Counter[int]],
        encoded_bytes: Sequence[int],
        word_lists: Sequence[Sequence[str]],
        prior: Prior | None,
    ) -> Evidence:
        """``Evidence`` of texts of one script, one row each, from the DFA's feature counts (py3langid's
        ``visit_counts``), their lengths in bytes and their words. A row sums its own words' features
        (``_word_features``), so a text gets the same row whatever it is classified with."""
        group = self._groups[script]
        n = len(group.codes)
        features = self._word_features(group, [w for words_ in word_lists for w in words_])
        ends = np.cumsum([len(words_) for words_ in word_lists]).tolist()
        visits, encoded_bytes = list(visits), list(encoded_bytes)
        rows = []  # per text: its words' features summed
        masks = np.zeros((len(word_lists), n))  # per short text: the words each language knows, as bits
        bias = np.zeros((len(word_lists), n))
        for row, ((a, b), words_) in enumerate(
            zip(zip([0, *ends], ends, strict=False), word_lists, strict=True)
        ):
            given = prior.bias(words_) if prior is not None else {}
            # The languages a name beside one of their words is left out for: supported or the prior's.
            served = group.supported.copy()
            for code, value in given.items():
                if value > 0 and code in group.index:
                    served[group.index[code]] = True
            names = (
                self._names(group, features[a:b], served)
                if b - a == NAME_QUERY_WORDS
                else np.zeros(b - a, dtype=bool)
            )
            if names.any():  # the names tell nothing: their features, characters and prior are left out
                kept = [w for w, name in zip(words_, names.tolist(), strict=True) if not name]
                rows.append(features[a:b][~names].sum(axis=0))
                encoded = LanguageIdentifier._encode(" ".join(kept))
                visits[row], encoded_bytes[row] = Counter(self._walk(encoded)[0]), len(encoded)
                given = prior.bias(kept) if prior is not None else {}
            else:
                rows.append(features[a:b].sum(axis=0))
            if b - a <= SHORT_QUERY_WORDS:
                known = (features[a:b, 3 * n : 4 * n] > 0) & ~names[:, None]
                masks[row] = (known * 2.0 ** np.arange(b - a)[:, None]).sum(axis=0)
            for code, value in given.items():
                at = group.index.get(code)
                if at is not None:
                    bias[row, at] += value
        summed = np.stack(rows)
        char = np.stack(
            [self._char(script, v or None, b) for v, b in zip(visits, encoded_bytes, strict=True)]
        )
        any_known = (summed[:, 3 * n : 4 * n] > 0) | group.no_list
        for row, words_ in enumerate(word_lists):
            if not words_:  # no words: none that a language lacks
                any_known[row] = True
        return Evidence(
            char=char,
            known_log10=summed[:, :n],
            unknown=summed[:, n : 2 * n],
            known_words=summed[:, 3 * n : 4 * n],
            known_masks=masks.astype(np.int64),
            any_known=any_known,
            long_letters=summed[:, 2 * n : 3 * n],
            international=summed[:, 4 * n],
            bias=bias,
        )

    @staticmethod
    def _names(group: _Group, features: np.ndarray, served: np.ndarray) -> np.ndarray:
        """Which of one text's words (its ``_word_features`` rows) are names: international English words
        (``LOAN_LOG10`` more frequent in English than in the other ``served`` languages, those supported or
        named by the prior) beside a word English's list lacks and another served language's holds.
        Beside "Birne" or "päron", "conference" is
        a pear's name, written alike in every language, and English's frequency of it (50 times German's)
        says nothing of the query's language: ``_evidence`` leaves it out of every kind of evidence."""
        n = len(group.codes)
        english = group.index.get("en")
        names = features[:, 4 * n] > 0
        if english is None or len(features) < 2 or not names.any():
            return np.zeros(len(features), dtype=bool)
        known = features[:, 3 * n : 4 * n] > 0
        others = served & group.has_list
        others[english] = False
        # An English word (LOAN_LOG10 more frequent in English than in the other served languages' lists:
        # "conference", not "fond" or "avec", which French writes as often)...
        elsewhere = np.where(known & others, features[:, :n], -np.inf).max(axis=1)
        names &= features[:, english] - elsewhere > LOAN_LOG10
        # ... beside a word of another served language that English lacks.
        foreign = ~known[:, english] & (known & others).any(axis=1)
        return names & (foreign.sum() > 0)

    def _word_features(self, group: _Group, flat: Sequence[str]) -> np.ndarray:
        """Per word, over the group's languages, side by side: the log10 frequency of the word where the
        language knows it (its list, or as a compound), whether it lacks it, the letters beyond
        ``OOV_FREE_LETTERS`` where it lacks it, whether it knows it; and last whether English shares it with
        ``INTERNATIONAL_LISTS`` other lists."""
        n = len(group.codes)
        logs, lists = self._words.columns(flat, group.from_table, n)  # (words, group), lists holding each
        lengths = [len(word) for word in flat]
        columns = group.split_columns
        if columns.size:
            low, high = COMPOUND_LETTERS
            for row, size in enumerate(lengths):
                if not low <= size <= high:
                    continue
                lacking = np.isnan(logs[row, columns])  # a compounding language lacks the word
                if lacking.any() and (split := compound_log10(flat[row])) is not None:
                    found = np.asarray(split)[group.split_order]
                    logs[row, columns[lacking]] = found[lacking]  # NaN where it does not split
        known = ~np.isnan(logs)
        size = np.asarray(lengths, dtype=np.float64)
        out = np.empty((len(flat), 4 * n + 1))
        np.copyto(out[:, :n], np.where(known, logs, 0.0))
        out[:, n : 2 * n] = ~known
        out[:, 2 * n : 3 * n] = out[:, n : 2 * n] * np.maximum(size - OOV_FREE_LETTERS, 0.0)[:, None]
        out[:, 3 * n : 4 * n] = known
        english = group.index.get("en")  # English is no compounding language: its column is its list's
        out[:, 4 * n] = (
            known[:, english] & (lists > INTERNATIONAL_LISTS) & (size >= INTERNATIONAL_LETTERS)
            if english is not None
            else 0.0
        )
        return out

    def _char(self, script: str, visits: Counter[int] | None, encoded_bytes: int) -> np.ndarray:
        """py3langid's character log-likelihood of each language of the script's group over sqrt(bytes)."""
        if not visits:
            return np.zeros(len(self._groups[script].codes), dtype=np.float32)
        idx = np.fromiter(visits.keys(), dtype=np.intp, count=len(visits))
        counts = np.fromiter(visits.values(), dtype=np.float32, count=len(visits))
        rows = self._char_tables[script][idx].astype(np.float32)  # float16 as stored: no BLAS for it
        return (np.log1p(counts) @ rows) / math.sqrt(encoded_bytes)

    def _weigh_rows(self, script: str, ev: Evidence) -> tuple[np.ndarray, np.ndarray]:
        """Per row of ``ev``: the probability of each language (relatives folded into the supported language
        they count for) and whether the language, or a relative folded into it, knows a word of the text."""
        group = self._groups[script]
        k, n = ev.char.shape
        prior = self._prior_terms.get((script, self.supported_prior))
        if prior is None:  # once per script and prior; a race only computes one twice
            # A folded family (Indonesian with Malay) shares one language's prior: on evidence that favours
            # no language it must not win twice as often.
            prior = self.supported_prior * group.supported - group.log_family
            self._prior_terms[(script, self.supported_prior)] = prior
        words_log10 = ev.known_log10 + self.oov_log10 * ev.unknown - self.oov_per_letter * ev.long_letters
        scores = (
            prior
            + self.char_weight * ev.char
            + _LN10 * words_log10
            + self.international_prior * ev.international[:, None] * group.english
            + ev.bias
        )
        probs = np.exp(scores - scores.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        cells = self._fold_cells.get((script, k))
        if cells is None:  # a few per script (k is 1 to 3); a race only computes one twice
            cells = self._fold_cells[(script, k)] = (np.arange(k)[:, None] * n + group.fold).ravel()
        folded = np.bincount(cells, weights=probs.ravel(), minlength=k * n).reshape(k, n)
        knows = np.bincount(cells, weights=ev.any_known.ravel(), minlength=k * n).reshape(k, n) > 0
        return folded, knows

    def weigh(self, evidence: Evidence, group: _Group) -> tuple[np.ndarray, np.ndarray]:
        """``_weigh_rows`` of one text's evidence (its first row) in ``group``: the probabilities and whether
        each language knows a word."""
        script = next(s for s, g in self._groups.items() if g is group)
        probs, knows = self._weigh_rows(script, evidence)
        return probs[0], knows[0]

    def _mixed(self, text: str, prior: Prior | None = None) -> bool:
        """Whether both halves of a text (by words) are confidently in different languages."""
        halves = self._halves(text)
        if halves is None:
            return False
        first, second = (self.classify(h, counts, prior) for h, counts in halves)
        return first[0] != second[0] and min(first[1], second[1]) >= MIXED_HALF_P

    @staticmethod
    def _halves(text: str) -> list[tuple[str, Counter[str]]] | None:
        """A text's two halves (by words) with their letters per script, for the mixed-language check;
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

    def _classify_together(
        self, texts: list[tuple[str, Counter[str]]], prior: Prior | None = None
    ) -> list[tuple[str, float]]:
        """``classify`` of each (text, letters per script), with the work they share done once: where the
        second text begins the first (a query's first half), the DFA's walk over it is the start of the
        first's walk; each text's evidence row is its own (``_evidence``)."""
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
        out: list[tuple[str, float]] = []
        for script, share in scripts:
            code = SCRIPT_LANGUAGE.get(script, "und")  # the script decides
            out.append((code, share if code != "und" else 0.0))
        for script in dict.fromkeys(scripts[i][0] for i in grouped):  # the texts of one script together
            at = [i for i in grouped if scripts[i][0] == script]
            word_lists = [words(texts[i][0]) if script != "HAN" else [] for i in at]
            ev = self._evidence(
                script, [visits[i] for i in at], [len(encoded[i]) for i in at], word_lists, prior
            )
            probs, knows = self._weigh_rows(script, ev)
            group = self._groups[script]
            for row, i in enumerate(at):
                if script == "HAN" and "ja" in group.index and not SHINJITAI.keys().isdisjoint(texts[i][0]):
                    out[i] = ("ja", scripts[i][1])  # a Japanese-only character form, as decisive as kana
                    continue
                best = int(probs[row].argmax())
                if len(word_lists[row]) <= SHORT_QUERY_WORDS:
                    best = self._served(group, best, probs[row], ev.known_masks[row], ev.bias[row])
                confidence = float(probs[row, best]) * scripts[i][1]
                if not knows[row, best]:
                    confidence = min(confidence, self.unknown_words_confidence)
                out[i] = (group.codes[best], confidence)
        return out

    @staticmethod
    def _served(
        group: _Group, best: int, probs: np.ndarray, known_masks: np.ndarray, bias: np.ndarray
    ) -> int:
        """The label of a short text: ``best``, unless it is a language neither supported nor named by the
        prior and a supported language knows every word of the text that ``best`` lacks (and another
        language knows), and as many words: then the likeliest of those (its probability is below
        ``best``'s, so under one half). A supported language that knows only what ``best`` knows (Polish
        beside Czech) leaves ``best`` its label."""
        if group.supported[best] or bias[best] > 0:
            return best
        masks = known_masks.tolist()
        mine = masks[best]
        lacking = int(np.bitwise_or.reduce(known_masks)) & ~mine  # words others know, ``best`` lacks
        if not lacking:
            return best
        served = group.supported & (group.fold == np.arange(len(group.codes)))
        served &= np.array([(m & lacking) == lacking and m.bit_count() >= mine.bit_count() for m in masks])
        return int(np.where(served, probs, -1.0).argmax()) if served.any() else best

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
