"""Lexical analysis of product text, shared by the writer (what is indexed) and every reader (how queries
are analysed): both sides must turn text into the same terms, so the analysis is part of the format.

- Text is NFKC-normalised and case-folded; words are runs of letters and digits (``regex``'s ``\\w``).
- Words in scripts written without spaces between words (Chinese, Japanese kana and kanji, Thai, and
  Hangul, whose particles attach to words) become overlapping character bigrams (a lone character stays a
  unigram), as Lucene's CJK analyser does: a 2-character Chinese query is one bigram term and finds the
  titles that contain it, with no dictionary.
- Other words are stemmed with the Snowball stemmer of the text's language where one exists (``STEMMERS``);
  a language without one keeps the case-folded word.

Terms are joined by spaces and indexed, diacritics folded, by the version's full-text engine
(``store.text.lexical_index``: tantivy, or SQLite FTS5 in versions written before it), which ranks them by
BM25.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from functools import lru_cache

import regex
import snowballstemmer

# ISO 639-1 -> Snowball algorithm.
STEMMERS: dict[str, str] = {
    "ar": "arabic", "ca": "catalan", "cs": "czech", "da": "danish", "de": "german", "el": "greek",
    "en": "english", "es": "spanish", "eu": "basque", "fi": "finnish", "fr": "french", "ga": "irish",
    "hi": "hindi", "hu": "hungarian", "hy": "armenian", "id": "indonesian", "it": "italian",
    "lt": "lithuanian", "ne": "nepali", "nl": "dutch", "no": "norwegian", "nb": "norwegian",
    "fa": "persian", "pl": "polish", "pt": "portuguese", "ro": "romanian", "ru": "russian",
    "sr": "serbian", "sv": "swedish", "ta": "tamil", "tr": "turkish", "et": "estonian",
}  # fmt: skip

_WORD = regex.compile(r"\w+", regex.UNICODE)
# Scripts without spaces between words (and Hangul, whose particles attach): character bigrams.
_BIGRAM_SCRIPT = regex.compile(
    r"[\u30fc\u3005\u309d\u309e\u30fd\u30fe\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Hangul}\p{Lao}\p{Khmer}]+"
)
MAX_TERMS = 256  # a query is at most 512 characters; titles and descriptions are bounded by this too


@lru_cache(maxsize=64)
def _stemmer(lang: str) -> snowballstemmer.BaseStemmer | None:
    algorithm = STEMMERS.get(lang.split("-")[0].split("_")[0].lower())
    return snowballstemmer.stemmer(algorithm) if algorithm else None


def _bigrams(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def analyze(text: str, lang: str | None) -> list[str]:
    """The terms of ``text`` read as language ``lang`` (None or unknown: not stemmed), in text order."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    stemmer = _stemmer(lang) if lang else None
    terms: list[str] = []
    for word in _WORD.findall(folded):
        pos = 0
        # A word may mix scripts ("iphone手机"): bigram the spaceless runs, stem the rest.
        for run in _BIGRAM_SCRIPT.finditer(word):
            if run.start() > pos:
                terms.append(_stem(word[pos : run.start()], stemmer))
            terms.extend(_bigrams(run.group()))
            pos = run.end()
        if pos < len(word):
            terms.append(_stem(word[pos:], stemmer))
        if len(terms) >= MAX_TERMS:
            break
    return [t for t in terms[:MAX_TERMS] if t]


def words_of(text: str) -> list[str]:
    """The words of ``text`` as analysis folds them (NFKC, case-folded), in text order, leaving out those
    with a character of a spaceless script (their bigrams are no words): what typo tolerance corrects and
    its vocabulary holds (``store.text.spelling``)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return [w for w in _WORD.findall(folded) if not _BIGRAM_SCRIPT.search(w)]


def _stem(word: str, stemmer: snowballstemmer.BaseStemmer | None) -> str:
    if stemmer is None or word.isdigit():
        return word
    return stemmer.stemWord(word)


def analyze_variants(text: str, languages: Sequence[str | None]) -> list[str]:
    """The union of ``text``'s terms read as each of ``languages``, first-seen order: a short query whose
    language is uncertain ("Bol blanco": Spanish? French? Portuguese?) is analysed as each likely language
    rather than as one wrong one (an unstemmed reading is always included)."""
    return union_of(readings_of(text, languages))


def readings_of(text: str, languages: Sequence[str | None]) -> list[list[str]]:
    """``text``'s terms read as each of ``languages`` (duplicates dropped) and unstemmed: the readings of a
    query whose language is uncertain, each scored on its own (``store.products.hybrid``)."""
    readings: list[list[str]] = []
    for lang in dict.fromkeys([*languages, None]):
        terms = analyze(text, lang)
        if terms and terms not in readings:
            readings.append(terms)
    return readings


def fold_diacritics(term: str) -> str:
    """A term as FTS5's ``unicode61 remove_diacritics 2`` keeps it in its vocabulary (letters without their
    combining marks); scripts whose marks are letters' parts (Thai) pass through as the tokenizer leaves
    them, near enough for a document-frequency look-up."""
    decomposed = unicodedata.normalize("NFD", term)
    return unicodedata.normalize(
        "NFC",
        "".join(
            c for c in decomposed if not unicodedata.combining(c) or (not c.isascii() and ord(c) > 0x36F)
        ),
    )


def union_of(readings: Sequence[Sequence[str]]) -> list[str]:
    """Every term of the readings once, first-seen order (at most ``MAX_TERMS``)."""
    return list(dict.fromkeys(t for reading in readings for t in reading))[:MAX_TERMS]


def match_expression(terms: Iterable[str]) -> str:
    """An FTS5 MATCH expression: any of the terms (each quoted as a string, so no term is read as an FTS5
    operator or column name)."""
    quoted = ['"' + t.replace('"', '""') + '"' for t in terms]
    return " OR ".join(quoted)


def word_spans(text: str, lang: str | None) -> list[tuple[str, int, int]]:
    """``text``'s words as synonyms are matched on them (``service.search.synonyms``): (key, start, end),
    the span in ``text`` itself (so a match can be substituted in the query as written), the key the word
    NFKC-normalised, case-folded and stemmed as ``analyze`` stems it. In scripts without spaces each
    character is a word of its own, so a synonym matches inside a run of them ("红色运动鞋")."""
    stemmer = _stemmer(lang) if lang else None
    spans: list[tuple[str, int, int]] = []
    for match in _WORD.finditer(text):
        word, base, pos = match.group(), match.start(), 0
        for run in _BIGRAM_SCRIPT.finditer(word):
            if run.start() > pos:
                spans.append((_fold_stem(word[pos : run.start()], stemmer), base + pos, base + run.start()))
            spans.extend((_fold(word[k]), base + k, base + k + 1) for k in range(run.start(), run.end()))
            pos = run.end()
        if pos < len(word):
            spans.append((_fold_stem(word[pos:], stemmer), base + pos, base + len(word)))
    return [s for s in spans if s[0]]


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def _fold_stem(word: str, stemmer: snowballstemmer.BaseStemmer | None) -> str:
    return _stem(_fold(word), stemmer)
