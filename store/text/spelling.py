"""A version's vocabulary of written words, and the nearest of them to a mistyped one: what typo tolerance
(``service.search.typos``) corrects a query word to.

The vocabulary is derived from the version's stored text values (``products.sqlite``'s ``texts``, which
every products format holds) when first asked for, not written beside them: versions written before it
are served alike and the on-disk format is unchanged. It holds

- every word of the text values (``store.text.lexical.words_of``: NFKC, case-folded, no spaceless-script
  words, whose bigrams are never fuzzed) with its document frequency (text values holding it);
- the languages each word was written in (its values' languages; ``und`` left out): what the service's
  query-language prior reads (``service.language.CatalogueLanguages``);
- every stem those words are indexed as (``store.text.lexical.analyze`` in their value's language), each with
  the most frequent word of that stem: "applws" is two edits from "apples" but its English stem "applw"
  one from the index's "appl".

Nearest forms are found by tantivy's fuzzy term queries (a Levenshtein automaton walked over the term
dictionary, transpositions one edit) on an index in memory of those words and stems; among forms at the
same distance the most frequent wins (then the first in code-point order), a word before a stem.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import tantivy

from store.text.lexical import analyze, words_of

_WORD, _STEM, _ID = "word", "stem", "id"
_WRITER_HEAP = 32 * 1024 * 1024
_HITS = 256  # forms read back per fuzzy query (a short word at one edit of a large vocabulary has many)
# Words longer than this are not corrected: a Levenshtein automaton grows with the word, and no product
# word is that long (a hostile 512-character query must not cost a second of CPU).
MAX_WORD = 32


def stem_budget(form: str) -> int:
    """The edits a form of this length may be away from another (one from 5 characters, two from 9)."""
    return 2 if len(form) >= 9 else 1 if len(form) >= 5 else 0


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field(_WORD, stored=False, tokenizer_name="raw", index_option="basic")
    builder.add_text_field(_STEM, stored=False, tokenizer_name="raw", index_option="basic")
    builder.add_integer_field(_ID, stored=False, indexed=False, fast=True)
    return builder.build()


@dataclass(frozen=True)
class Nearest:
    """A vocabulary word a typed word is corrected to."""

    word: str
    edits: int  # of the typed word to ``word``, or of its stem to ``word``'s stem
    via_stem: bool = False


class Vocabulary:
    """The words and stems of one version's text values (read-only; thread-safe)."""

    def __init__(
        self,
        words: dict[str, int],
        stems: dict[str, str],
        languages: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.words = words  # word -> text values holding it
        self.stems = stems  # stem -> its most frequent word
        self._languages = languages or {}  # word -> the languages it was written in
        self._forms: list[tuple[str, str]] = []  # id -> (field, form)
        schema = _schema()
        index = tantivy.Index(schema)  # in memory
        writer = index.writer(heap_size=_WRITER_HEAP, num_threads=1)
        for field, forms in ((_WORD, words), (_STEM, stems)):
            for form in forms:
                writer.add_document(tantivy.Document(**{field: form, _ID: len(self._forms)}))
                self._forms.append((field, form))
        writer.commit()
        writer.wait_merging_threads()
        index.reload()
        self._schema = schema
        self._searcher = index.searcher()

    @classmethod
    def of_texts(cls, values: Iterable[tuple[str, str | None]]) -> Vocabulary:
        """The vocabulary of (text, language) values."""
        df: Counter[str] = Counter()
        languages: defaultdict[str, set[str | None]] = defaultdict(set)
        for text, lang in values:
            held = set(words_of(text))
            df.update(held)
            for word in held:
                languages[word].add(None if lang in (None, "und") else lang)
        stems: dict[str, str] = {}
        for word, langs in languages.items():
            for lang in langs:
                for stem in analyze(word, lang):
                    best = stems.get(stem)
                    if best is None or (df[word], best) > (df[best], word):
                        stems[stem] = word
        shared: dict[frozenset[str], tuple[str, ...]] = {}  # one tuple per set of languages, not per word
        written = {
            word: shared.setdefault(frozenset(known), tuple(sorted(known)))
            for word, langs in languages.items()
            if (known := {lang for lang in langs if lang is not None})
        }
        return cls(dict(df), stems, written)

    def __len__(self) -> int:
        return len(self.words)

    def languages_of(self, word: str) -> tuple[str, ...]:
        """The languages of the text values that write ``word`` (folded as ``words_of`` folds it)."""
        return self._languages.get(word, ())

    def knows(self, word: str, stems: Sequence[str] = ()) -> bool:
        """Whether ``word`` (folded as ``words_of`` folds it), or one of its ``stems``, is written in the
        version's text."""
        return word in self.words or any(s in self.stems for s in stems)

    def nearest(self, word: str, stems: Sequence[str], max_edits: int) -> Nearest | None:
        """The vocabulary word nearest ``word`` within ``max_edits`` (the word's own, or one of its
        ``stems`` to a stem of the vocabulary), fewest edits first; None where none is that near."""
        if not word or len(word) > MAX_WORD:
            return None
        for edits in range(1, max_edits + 1):
            found = self._within(_WORD, word, edits)
            if found:
                return Nearest(self._most_frequent(found), edits)
            # A stem is held to the budget of its own length: Snowball cuts "peras" to "per" and "leite" to
            # "leit", which are one edit from many unrelated stems ("or", "kept" on the grocery catalogue).
            by_stem = [
                self.stems[s]
                for stem in stems
                if stem_budget(stem) >= edits
                for s in self._within(_STEM, stem, edits)
            ]
            if by_stem:
                return Nearest(self._most_frequent(by_stem), edits, via_stem=True)
        return None

    def within(self, word: str, edits: int) -> list[str]:
        """The vocabulary words exactly ``edits`` or fewer edits from ``word`` (no stems), in no order."""
        if not word or len(word) > MAX_WORD:
            return []
        return self._within(_WORD, word, edits)

    def _most_frequent(self, words: Sequence[str]) -> str:
        return min(words, key=lambda w: (-self.words.get(w, 0), w))

    def _within(self, field: str, form: str, edits: int) -> list[str]:
        query = tantivy.Query.fuzzy_term_query(
            self._schema, field, form, distance=edits, transposition_cost_one=True, prefix=False
        )
        hits = self._searcher.search(query, _HITS, count=False).hits  # tantivy's searcher: thread-safe
        if not hits:
            return []
        ids = self._searcher.fast_field_values(_ID, [address for _, address in hits])
        return [self._forms[int(i)][1] for i in ids]
