"""The full-text engines behind a version's lexical channel (``store.products.channels``): BM25 over the
analysed
terms of the product text values (``store.text.lexical``), one document per text value, its id the text row.

- **tantivy** (written since products format 2): a folder ``lexical.tantivy/`` in the version. One text
  field ``terms`` (tokenizer ``whitespace``: the terms arrive analysed; frequencies, no positions) and a
  fast field ``row``. Terms are stored folded as ``store.text.lexical.fold_diacritics`` folds them, and
  queries
  are folded the same way. BM25 with k1 1.2, b 0.75 and IDF ln(1 + (N - n + 0.5) / (n + 0.5)).
- **FTS5** (products format 1, still served): a table ``lexical`` in ``products.sqlite``
  (``unicode61 remove_diacritics 2``) and its ``fts5vocab``.

Why tantivy: ``bench/lexical_engines.py`` (``bench/results/lexical-engines-2026-11-26.json``) measured the
product's 3-term query at LIMIT 512 at p50 34.6 ms on FTS5 against 0.40 ms on tantivy at 100k values (149
against 1.37 ms at 1M): FTS5 walks every posting of every term, tantivy skips blocks (block-max WAND), with
the same top results up to the IDF formula.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import tantivy

from store.errors import IndexFormatError
from store.files import names_full_disk
from store.layout import LEXICAL_DIR
from store.text.lexical import fold_diacritics, match_expression

TANTIVY_DIR = LEXICAL_DIR
_FIELD, _ROW = "terms", "row"
_WRITER_HEAP = 64 * 1024 * 1024
_LOCK_FILES = (".tantivy-meta.lock", ".tantivy-writer.lock")


class LexicalIndex(Protocol):
    """BM25 over the text values of one version (thread-safe)."""

    def search(
        self, terms: Sequence[str], limit: int, weights: Mapping[str, float] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``limit`` best text rows for any of ``terms`` and their BM25 scores (higher is better);
        ``weights``: a factor on some terms' scores (typo-corrected terms weigh less than typed ones)."""
        ...

    def doc_freqs(self, terms: Sequence[str]) -> dict[str, int]:
        """How many text values hold each term."""
        ...

    def close(self) -> None: ...


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field(_FIELD, stored=False, tokenizer_name="whitespace", index_option="freq")
    builder.add_integer_field(_ROW, stored=False, indexed=False, fast=True)
    return builder.build()


def write_tantivy(stage: Path, terms: Sequence[Sequence[str]]) -> None:
    """Write the tantivy index of ``terms`` (one list per text row) into a version being staged: one
    segment, no lock files left behind."""
    folder = Path(stage) / TANTIVY_DIR
    with names_full_disk(folder):
        folder.mkdir()
        try:
            index = tantivy.Index(_schema(), path=str(folder))
            writer = index.writer(heap_size=_WRITER_HEAP, num_threads=1)
            for row, value in enumerate(terms):
                folded = " ".join(map(fold_diacritics, value))
                writer.add_document(tantivy.Document(**{_FIELD: folded, _ROW: row}))
            writer.commit()
            writer.wait_merging_threads()
            del writer, index
        except (OSError, ValueError, RuntimeError):
            shutil.rmtree(folder, ignore_errors=True)
            raise
        for name in _LOCK_FILES:
            (folder / name).unlink(missing_ok=True)


class TantivyLexical:
    """A version's tantivy index, opened read-only.

    tantivy's reader creates a lock file in the folder it opens (``.tantivy-meta.lock``), which a published
    version must never get and a read-only volume (the API pods mount indexes read-only) refuses. So it
    opens a private view instead: a temporary folder of symbolic links to the version's files, removed on
    ``close``."""

    def __init__(self, folder: Path, rows: int) -> None:
        try:
            self._view = Path(tempfile.mkdtemp(prefix="ccrk-lexical-"))
        except OSError as exc:  # a full or read-only temporary folder: said, as any unreadable index
            raise IndexFormatError(
                f"cannot open the lexical index {folder}: no temporary folder ({exc})"
            ) from exc
        # Removed on close, or when the object goes away unclosed (an exception between open and close).
        self._remove_view = weakref.finalize(self, shutil.rmtree, self._view, ignore_errors=True)
        try:
            for path in Path(folder).iterdir():
                if path.is_file() and not path.name.startswith("."):
                    (self._view / path.name).symlink_to(path.resolve())
            index = tantivy.Index.open(str(self._view))
            self._searcher = index.searcher()
        except (OSError, ValueError, RuntimeError) as exc:
            self._remove_view()
            raise IndexFormatError(f"cannot open the lexical index {folder}: {exc}") from exc
        if int(self._searcher.num_docs) != rows:
            self.close()
            raise IndexFormatError(f"{folder} holds {self._searcher.num_docs} text values, expected {rows}")
        self._schema = index.schema

    def search(
        self, terms: Sequence[str], limit: int, weights: Mapping[str, float] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        factor: dict[str, float] = {}
        for t in terms:  # a term folded like another keeps the greater weight (a typed one's)
            f = fold_diacritics(t)
            factor[f] = max(factor.get(f, 0.0), 1.0 if weights is None else float(weights.get(t, 1.0)))
        queries = []
        for t, w in factor.items():
            q = tantivy.Query.term_query(self._schema, _FIELD, t, "freq")
            queries.append(q if w == 1.0 else tantivy.Query.boost_query(q, w))
        query = queries[0]
        if len(queries) > 1:
            query = tantivy.Query.boolean_query([(tantivy.Occur.Should, q) for q in queries])
        hits = self._searcher.search(query, limit, count=False).hits
        if not hits:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        rows = self._searcher.fast_field_values(_ROW, [address for _, address in hits])
        return np.asarray(rows, np.int64), np.asarray([score for score, _ in hits], np.float32)

    def doc_freqs(self, terms: Sequence[str]) -> dict[str, int]:
        return {t: int(self._searcher.doc_freq(_FIELD, fold_diacritics(t))) for t in terms}

    def close(self) -> None:
        self._searcher = None
        self._remove_view()


class Fts5Lexical:
    """The FTS5 table of a version written before tantivy (products format 1), over the channels' own
    read-only connection and its lock."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock) -> None:
        self._db, self._lock = db, lock

    def search(
        self, terms: Sequence[str], limit: int, weights: Mapping[str, float] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        # FTS5's bm25() weighs columns, not terms: a format-1 version scores corrected terms as typed ones
        # (the fused ``lexical`` feature still weighs them less, ``store.products.hybrid._coverage``).
        with self._lock:
            found = self._db.execute(
                "SELECT rowid, bm25(lexical) FROM lexical WHERE lexical MATCH ? ORDER BY rank LIMIT ?",
                (match_expression(terms), limit),
            ).fetchall()
        return np.asarray([r for r, _ in found], np.int64), np.asarray([-s for _, s in found], np.float32)

    def doc_freqs(self, terms: Sequence[str]) -> dict[str, int]:
        # The vocabulary holds terms as the tokenizer folded them (diacritics removed): look them up so.
        folded = {t: fold_diacritics(t) for t in terms}
        marks = ",".join("?" * len(folded))
        with self._lock:
            by_folded = dict(
                self._db.execute(
                    f"SELECT term, doc FROM lexical_vocab WHERE term IN ({marks})", list(folded.values())
                )
            )
        return {t: int(by_folded.get(f, 0)) for t, f in folded.items()}

    def close(self) -> None:
        pass  # the connection is the channels'
