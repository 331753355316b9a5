"""A version's product channels: every photo of every product, the product's text fields (their dense
embeddings and a full-text index), and the fusion calibrated for them at build time.

A version's rows stay products (one row each in ``embeddings.npy``, ``metadata.sqlite``, the re-rank store:
the product's first photo). A version built from products with several photos or with searched text fields
also holds, beside them (all written through ``ProductChannelsWriter``, read through ``ProductChannels``)::

    products.json            what is there: text fields, their languages, counts, the fusion and labels
    photo_embeddings.npy     (M, D) float32 cross-modal embeddings of all M photos, grouped by product row
    photo_visual.npy         (M, V) float32 visual embeddings (image-to-image search), when the model has
                             one apart from its cross-modal embedding (the starter)
    photo_owners.npy         (M,) int64 the product row of each photo, ascending
    photos.faiss             ANN index over photo_embeddings (ids: photo rows)
    text_embeddings.npy      (F, D) float32 embeddings of all F text values (product x field)
    text_owners.npy          (F,) int64 the product row of each text value, ascending
    text_fields.npy          (F,) int16 index into products.json's ``fields``
    text_langs.npy           (F,) int16 index into products.json's ``text_languages``
    texts.faiss              ANN index over text_embeddings (ids: text rows)
    products.sqlite          photos(row, owner, path); texts(row, owner, field, lang, text, terms)
                             (terms: ``store.text.lexical.analyze`` of the text, space-separated)
    lexical.tantivy/         BM25 over those terms (``store.text.lexical_index``), document id = text row
    text_term_hashes.npy     those terms again as 64-bit hashes, and their row offsets
    text_term_offsets.npy    (``store.products.term_hashes``; written since 27 Nov 2026, read when present)
    text_sum_norms.npy       (P,) float32 the norm of the sum of each product's text embeddings: the
                             centroid feature's divisor (``store.products.vectors.sum_norms``; written since
                             27 Nov 2026 (session 13); a version without it has no centroid feature)
    photo_digests.npy, ...   what a rebuild reuses photos and text values by (``store.product_reuse``;
                             written since 27 Nov 2026, session 14)

Products format 1 (written before tantivy, still served) keeps the lexical index in ``products.sqlite`` as
an FTS5 table ``lexical`` (rowid = text row, its ``terms`` column the analysed terms) instead.

A version without these files (every version written before them, and one-photo catalogues without text
fields) is searched exactly as before. Checksums cover these files like any other (``store.layout``). A
sharded version holds them once, beside its shards, over its global rows (``store.shards.sharded``).

(Over 400 lines: the channel files are written and read here only, so that their format is in one place.)
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from store.errors import IndexFormatError
from store.files import names_full_disk
from store.guard import FileGuard
from store.products.term_hashes import TermHashes, write_term_hashes
from store.products.vectors import ChannelHits, GroupedVectors, best_per_owner, sum_norms
from store.text.lexical_index import TANTIVY_DIR, Fts5Lexical, LexicalIndex, TantivyLexical, write_tantivy
from store.text.spelling import Vocabulary

PRODUCTS_FILE = "products.json"
PHOTO_EMBEDDINGS = "photo_embeddings.npy"
PHOTO_VISUAL = "photo_visual.npy"
PHOTO_OWNERS = "photo_owners.npy"
PHOTO_INDEX = "photos.faiss"
TEXT_EMBEDDINGS = "text_embeddings.npy"
TEXT_OWNERS = "text_owners.npy"
TEXT_FIELDS = "text_fields.npy"
TEXT_LANGS = "text_langs.npy"
TEXT_INDEX = "texts.faiss"
TEXT_SUM_NORMS = "text_sum_norms.npy"
PRODUCTS_DB = "products.sqlite"
PRODUCTS_FORMAT = 2  # 2: the lexical index in tantivy; 1: in FTS5 (read, never written)
# Every file a version's channels may hold at its top (besides ``lexical.tantivy/`` and the digests of
# ``store.product_reuse``), for ``store.product_reuse.link_channels``.
CHANNEL_FILES = (
    PRODUCTS_FILE,
    PHOTO_EMBEDDINGS,
    PHOTO_VISUAL,
    PHOTO_OWNERS,
    PHOTO_INDEX,
    TEXT_EMBEDDINGS,
    TEXT_OWNERS,
    TEXT_FIELDS,
    TEXT_LANGS,
    TEXT_INDEX,
    TEXT_SUM_NORMS,
    PRODUCTS_DB,
)
# Vector sets up to this size are searched exactly: the reference, and no dearer than a walk tuned to the
# target recall there (one thread, 512-d: exact 0.55 ms at 4k rows, 2.7 at 16k; a tuned walk 0.54 ms at 3k
# rows, efSearch 96, and 0.45 at 24k, efSearch 32).
EXACT_MAX = 4_096
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 80, 96

_SCHEMA = """
CREATE TABLE photos(row INTEGER PRIMARY KEY, owner INTEGER NOT NULL, path TEXT NOT NULL);
CREATE TABLE texts(row INTEGER PRIMARY KEY, owner INTEGER NOT NULL, field TEXT NOT NULL, lang TEXT,
                   text TEXT NOT NULL, terms TEXT NOT NULL);
CREATE INDEX photos_owner ON photos(owner);
CREATE INDEX texts_owner ON texts(owner);
"""


@dataclass
class ProductInfo:
    """``products.json``: what the channels hold and how they are fused.

    Attributes:
        fields: the searched text fields (base names: ``title`` covers ``title`` and ``title@de``).
        text_languages: the languages of the text values, by index (``text_langs.npy``); ``und`` unknown.
        language_counts: text values per language.
        photos, texts: row counts of the photo and text arrays.
        visual_dim: width of ``photo_visual.npy``; 0 when the cross-modal embeddings serve image queries.
        fusion: the calibrated fusion (``store.products.hybrid.FusionModel.to_dict()``), empty before
        calibration.
        calibration: what the calibration measured (held-out scores of every method tried, query counts).
        search_params: per graph index file, the efSearch its walks use and the product-level recall it
            was measured at (``indexer.channel_tuning``); a graph without one walks at ``HNSW_EF_SEARCH``.
        inputs_key: a key of everything the channels were written, tuned and calibrated from (their rows
            and vectors, the recall target; ``indexer.product_reuse.inputs_key``): a rebuild with the same
            key takes the channels over as they are (``store.product_reuse.link_channels``); "" unknown.
        calibrated_in: the version whose build calibrated ``fusion`` ("": this one's);
            changed_since_calibration: photo and text rows changed since (a rebuild takes a calibration
            over while few changed, ``indexer.product_reuse.taken_over_calibration``).
        text_encoder: what the text embeddings were made with beyond the model's fingerprint (its language
            acquirers' digest; "": none): a rebuild reuses text embeddings only under the same.
        calibration_code: the version of the calibration code ``fusion`` was fitted by (0: before it was
            recorded): a rebuild takes a calibration over only from the same.
    """

    fields: list[str]
    text_languages: list[str]
    language_counts: dict[str, int]
    photos: int
    texts: int
    visual_dim: int = 0
    fusion: dict[str, Any] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)
    search_params: dict[str, dict[str, float]] = field(default_factory=dict)
    inputs_key: str = ""
    calibrated_in: str = ""
    changed_since_calibration: int = 0
    text_encoder: str = ""
    calibration_code: int = 0
    format: int = PRODUCTS_FORMAT

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, ensure_ascii=False)

    @classmethod
    def load(cls, path: Path) -> ProductInfo:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            if not isinstance(data, dict) or int(data.get("format", 0)) > PRODUCTS_FORMAT:
                raise IndexFormatError(f"{path}: unsupported products format {data.get('format')!r}")
            known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
            return cls(**known)
        except (OSError, ValueError, TypeError) as exc:
            raise IndexFormatError(f"cannot read {path}: {exc}") from None


@dataclass
class PhotoRows:
    """All photos of a version's products, grouped by product row (owners ascending)."""

    owners: np.ndarray  # (M,) int64
    paths: list[str]
    embeds: np.ndarray  # (M, D) float32
    visual: np.ndarray | None = None  # (M, V) float32
    # The files' content digests and stats when hashed (``store.product_reuse``); None: not known.
    digests: np.ndarray | None = None  # (M, 16) uint8
    stats: np.ndarray | None = None  # (M, 5) int64

    def extended(self, more: PhotoRows) -> PhotoRows:
        """These photos, then ``more`` (whose owners must come after these')."""

        def both(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
            return None if a is None or b is None else np.concatenate([a, b])

        return PhotoRows(
            np.concatenate([self.owners, more.owners]),
            [*self.paths, *more.paths],
            np.concatenate([self.embeds, more.embeds]),
            both(self.visual, more.visual),
            both(self.digests, more.digests),
            both(self.stats, more.stats),
        )


@dataclass
class TextRows:
    """All searched text values of a version's products, grouped by product row (owners ascending)."""

    owners: np.ndarray  # (F,) int64
    fields: list[str]  # base field name per value
    langs: list[str]  # language per value ("und": unknown)
    texts: list[str]
    terms: list[list[str]]  # ``store.text.lexical.analyze`` of each value in its language
    embeds: np.ndarray  # (F, D) float32

    def extended(self, more: TextRows) -> TextRows:
        """These values, then ``more`` (whose owners must come after these')."""
        return TextRows(
            np.concatenate([self.owners, more.owners]),
            [*self.fields, *more.fields],
            [*self.langs, *more.langs],
            [*self.texts, *more.texts],
            [*self.terms, *more.terms],
            np.concatenate([self.embeds, more.embeds.reshape(-1, self.embeds.shape[1])]),
        )


def _vector_index(vectors: np.ndarray, exact_max: int) -> Any:
    d = int(vectors.shape[1])
    if vectors.shape[0] <= exact_max:
        index: Any = faiss.IndexFlatIP(d)
    else:
        # The graph walks over half-precision vectors: a walk finds candidates only (their scores are then
        # computed exactly from the float32 array, ``GroupedVectors.best_of``), and at 75k photos x 512 it
        # took 1.10 ms against 1.63 over float32 at the same recall@50 products (0.311 / 0.312).
        index = faiss.IndexHNSWSQ(d, faiss.ScalarQuantizer.QT_fp16, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.hnsw.efSearch = HNSW_EF_SEARCH
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


def _check_grouped(owners: np.ndarray, what: str) -> None:
    if owners.size and np.any(np.diff(owners) < 0):
        raise IndexFormatError(f"internal: {what} rows must be grouped by product row (owners ascending)")


def write_product_channels(
    stage: Path, info: ProductInfo, photos: PhotoRows, texts: TextRows, *, exact_max: int = EXACT_MAX
) -> None:
    """Write every product-channel file into a version being staged (``store.version.writer``)."""
    stage = Path(stage)
    _check_grouped(photos.owners, "photo")
    _check_grouped(texts.owners, "text")
    info.photos, info.texts = int(photos.owners.size), int(texts.owners.size)
    info.visual_dim = 0 if photos.visual is None else int(photos.visual.shape[1])
    lang_ids = {lang: i for i, lang in enumerate(info.text_languages)}
    field_ids = {name: i for i, name in enumerate(info.fields)}
    arrays: dict[str, np.ndarray] = {
        PHOTO_EMBEDDINGS: np.asarray(photos.embeds, np.float32),
        PHOTO_OWNERS: np.asarray(photos.owners, np.int64),
        # No text value (several photos, no text field searched): an empty (0, D) array as it comes.
        TEXT_EMBEDDINGS: np.asarray(texts.embeds, np.float32).reshape(len(texts.texts), -1)
        if texts.texts
        else np.zeros((0, photos.embeds.shape[1]), np.float32),
        TEXT_OWNERS: np.asarray(texts.owners, np.int64),
        TEXT_FIELDS: np.asarray([field_ids[f] for f in texts.fields], np.int16),
        TEXT_LANGS: np.asarray([lang_ids[lang] for lang in texts.langs], np.int16),
    }
    if photos.visual is not None:
        arrays[PHOTO_VISUAL] = np.asarray(photos.visual, np.float32)
    owners = [o for o in (arrays[PHOTO_OWNERS], arrays[TEXT_OWNERS]) if o.size]
    products = max(int(o[-1]) + 1 for o in owners) if owners else 0
    arrays[TEXT_SUM_NORMS] = sum_norms(arrays[TEXT_EMBEDDINGS], arrays[TEXT_OWNERS], products)
    for name, array in arrays.items():
        with names_full_disk(stage / name):
            np.save(stage / name, array)
    for name, vectors in ((PHOTO_INDEX, arrays[PHOTO_EMBEDDINGS]), (TEXT_INDEX, arrays[TEXT_EMBEDDINGS])):
        if vectors.shape[0]:
            with names_full_disk(stage / name):
                faiss.write_index(_vector_index(vectors, exact_max), str(stage / name))
    db = stage / PRODUCTS_DB
    with names_full_disk(db):
        con = sqlite3.connect(db)
        try:
            con.executescript(_SCHEMA)
            con.executemany(
                "INSERT INTO photos(row, owner, path) VALUES (?, ?, ?)",
                ((i, int(o), p) for i, (o, p) in enumerate(zip(photos.owners, photos.paths, strict=True))),
            )
            rows = zip(texts.owners, texts.fields, texts.langs, texts.texts, texts.terms, strict=True)
            con.executemany(
                "INSERT INTO texts(row, owner, field, lang, text, terms) VALUES (?, ?, ?, ?, ?, ?)",
                ((i, int(o), f, lang, t, " ".join(terms)) for i, (o, f, lang, t, terms) in enumerate(rows)),
            )
            con.commit()
        finally:
            con.close()
    write_tantivy(stage, texts.terms)
    write_term_hashes(stage, texts.terms)
    with names_full_disk(stage / PRODUCTS_FILE):
        (stage / PRODUCTS_FILE).write_text(info.to_json() + "\n", encoding="utf-8")


def _reads_centroid(fusion: dict[str, Any]) -> bool:
    """Whether a stored fusion (``store.products.hybrid.FusionModel.to_dict``) has a group whose parameters
    name the
    centroid feature (read from ``text_sum_norms.npy``). One of another shape (a damaged ``products.json``)
    does not: the service cannot parse it and fuses by reciprocal rank (``service.search.hybrid``), which
    reads no centroid, so the version still opens."""
    tables = [fusion.get(mode) for mode in ("hybrid", "text")] if isinstance(fusion, dict) else []
    groups = [params for table in tables if isinstance(table, dict) for params in table.values()]
    return any(
        isinstance(params, dict)
        and isinstance(params.get("features"), list)
        and "centroid" in params["features"]
        for params in groups
    )


def default_mode(channels: ProductChannels | None) -> str:
    """The mode a text query without one searches a version in: hybrid where the version has searched text
    fields, else image (the service's default, and what the quality gate probes)."""
    return "hybrid" if channels is not None and channels.info.texts > 0 else "image"


def has_product_channels(version_dir: Path) -> bool:
    return (Path(version_dir) / PRODUCTS_FILE).is_file()


class ProductChannels:
    """The product channels of one opened version (read-only; thread-safe)."""

    def __init__(self, version_dir: Path, products: int) -> None:
        self.path = Path(version_dir)
        self.info = ProductInfo.load(self.path / PRODUCTS_FILE)
        # The mapped arrays, SQLite and tantivy files (``store.guard``); the rest is read into memory here.
        self._guard = FileGuard()
        try:
            self._open_files(products)
        except BaseException:
            self._guard.close()
            raise

    def _open_files(self, products: int) -> None:
        guard = self._guard
        try:
            owners = np.load(self.path / PHOTO_OWNERS)
            embeds = guard.map_array(self.path / PHOTO_EMBEDDINGS)
            self.photos = GroupedVectors(embeds, owners, self._index(PHOTO_INDEX, owners.size), products)
            visual = self.path / PHOTO_VISUAL
            self.visual = (
                GroupedVectors(guard.map_array(visual), owners, None, products) if visual.is_file() else None
            )
            t_owners = np.load(self.path / TEXT_OWNERS)
            t_embeds = guard.map_array(self.path / TEXT_EMBEDDINGS)
            self.texts = GroupedVectors(t_embeds, t_owners, self._index(TEXT_INDEX, t_owners.size), products)
            for grouped, rows in (
                (self.photos, owners.size),
                (self.visual, owners.size),
                (self.texts, t_owners.size),
            ):
                if grouped is not None and len(grouped.vectors) != rows:
                    raise IndexFormatError(f"{self.path}: {len(grouped.vectors)} vectors for {rows} owners")
            self.text_fields = np.load(self.path / TEXT_FIELDS)
            self.text_langs = np.load(self.path / TEXT_LANGS)
            self._term_hashes = TermHashes.open(self.path, int(t_owners.size), guard.map_array)
            self.text_sum_norms = self._sum_norms(products)
        except (OSError, ValueError, RuntimeError) as exc:
            raise IndexFormatError(f"cannot read the product channels of {self.path}: {exc}") from exc
        if self.text_sum_norms is None and _reads_centroid(self.info.fusion):
            raise IndexFormatError(
                f"{self.path}: its fusion reads the centroid feature; {TEXT_SUM_NORMS} is missing"
            )
        if owners.size != self.info.photos or t_owners.size != self.info.texts:
            raise IndexFormatError(f"{self.path}: product channel row counts differ from {PRODUCTS_FILE}")
        if owners.size and (owners[0] < 0 or owners[-1] >= products):
            raise IndexFormatError(f"{self.path}: photo owners outside the version's {products} rows")
        self._lock = threading.Lock()
        self._vocabulary: Vocabulary | None = None
        self._mean_terms: float | None = None
        self._vocabulary_lock = threading.Lock()
        guard.watch(self.path / PRODUCTS_DB)
        self._fts5 = not (self.path / TANTIVY_DIR).is_dir()
        if not self._fts5:
            guard.watch_tree(self.path / TANTIVY_DIR)  # tantivy maps its files too
        self._db = sqlite3.connect(
            f"file:{self.path / PRODUCTS_DB}?mode=ro&immutable=1", uri=True, check_same_thread=False
        )
        try:
            self._lexical: LexicalIndex = (
                Fts5Lexical(self._db, self._lock)
                if self._fts5
                else TantivyLexical(self.path / TANTIVY_DIR, int(t_owners.size))
            )
        except IndexFormatError:
            self._db.close()
            raise

    def _sum_norms(self, products: int) -> np.ndarray | None:
        """``text_sum_norms.npy`` over the version's rows (a product after the last one with a photo or text
        has none), or None where the version was written without it."""
        path = self.path / TEXT_SUM_NORMS
        if not path.is_file():
            return None
        norms = np.load(path)
        if norms.ndim != 1 or norms.size > products:
            raise IndexFormatError(f"{path}: {norms.shape} norms for {products} products")
        return np.pad(norms.astype(np.float32, copy=False), (0, products - norms.size))

    def _index(self, name: str, rows: int) -> Any | None:
        path = self.path / name
        if not rows:
            return None
        index = faiss.read_index(str(path))
        if index.ntotal != rows:
            raise IndexFormatError(f"{path} holds {index.ntotal} vectors, expected {rows}")
        if isinstance(index, faiss.IndexHNSW):
            try:
                index.hnsw.efSearch = int(
                    self.info.search_params.get(name, {}).get("efSearch", HNSW_EF_SEARCH)
                )
            except (TypeError, ValueError, OverflowError, AttributeError) as exc:  # hand-edited: Infinity, []
                raise IndexFormatError(f"{self.path}: unusable search_params for {name}: {exc}") from exc
        return index

    def close(self) -> None:
        self._lexical.close()
        with self._lock:
            self._db.close()
        self._guard.close()

    def damage(self) -> str | None:
        """What is wrong with the channels' files since their open (``store.guard``), None when nothing."""
        return self._guard.problem()

    @property
    def visual_vectors(self) -> GroupedVectors:
        """The vectors image-to-image search uses: the visual embeddings, else the cross-modal ones."""
        return self.visual if self.visual is not None else self.photos

    # -- lexical ---------------------------------------------------------------------------------------------

    def lexical(
        self,
        terms: Sequence[str],
        n: int,
        allowed: np.ndarray | None,
        row_mask: np.ndarray | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> ChannelHits:
        """BM25 over the text values, best value per product (higher is better); ``row_mask`` over text
        rows (calibration leaves fields or languages out); ``weights``: a factor on some terms' scores."""
        if not terms or n < 1 or self.info.texts == 0:  # tantivy panics on a limit of 0
            return ChannelHits.empty()
        if allowed is not None and not allowed.any():
            return ChannelHits.empty()
        # The best n products are exactly those of the best rows once these hold n distinct products (each
        # product's best row comes before its others): start at the catalogue's values per product (at least
        # two), widen while too few.
        limit = n * max(2, -(-self.info.texts // max(1, self.texts.products)))
        while True:  # wider while a filter (or deletions, or many values a product) leaves too few
            rows, scores = self._lexical.search(terms, limit, weights)
            keep = np.ones(rows.size, bool)
            if rows.size and allowed is not None:
                keep &= allowed[self.texts.owners[rows]]
            if rows.size and row_mask is not None:
                keep &= row_mask[rows]
            hits = best_per_owner(self.texts.owners[rows[keep]], scores[keep], rows[keep], ranked=True)
            if len(hits.owners) >= n or rows.size < limit:
                return ChannelHits(hits.owners[:n], hits.scores[:n], hits.via[:n])
            limit *= 4

    def vocabulary(self) -> Vocabulary:
        """The words of the version's text values (``store.text.spelling``), derived from them on first use
        (a version does not store it) and kept while the version is open."""
        with self._vocabulary_lock:
            if self._vocabulary is None:
                with self._lock:
                    values = self._db.execute("SELECT text, lang FROM texts").fetchall()
                self._vocabulary = Vocabulary.of_texts(values)
            return self._vocabulary

    def doc_freqs(self, terms: Sequence[str]) -> dict[str, int]:
        """The text values holding each term (as the lexical index counts them: folded)."""
        return self._lexical.doc_freqs(terms) if terms else {}

    def mean_terms(self) -> float:
        """The mean count of terms per text value (BM25's mean length), read once."""
        with self._vocabulary_lock:
            if self._mean_terms is None:
                table = "lexical" if self._fts5 else "texts"
                with self._lock:
                    total, count = self._db.execute(
                        "SELECT sum(CASE WHEN terms = '' THEN 0 ELSE "
                        f"length(terms) - length(replace(terms, ' ', '')) + 1 END), count(*) FROM {table}"
                    ).fetchone()
                self._mean_terms = float(total or 0) / max(1, int(count or 0))
            return self._mean_terms

    def term_idf(self, terms: Sequence[str]) -> dict[str, float]:
        """Inverse document frequency (BM25's, floored at a small positive value) of each term."""
        if not terms:
            return {}
        docs = self._lexical.doc_freqs(terms)
        total = max(1, self.info.texts)
        idf = {}
        for term in terms:
            df = docs.get(term, 0)
            idf[term] = float(max(np.log((total - df + 0.5) / (df + 0.5) + 1.0), 1e-3))
        return idf

    def terms_of(self, text_rows: Sequence[int]) -> dict[int, list[str]]:
        """The stored terms of text values (``presence`` of a version written before the term hashes)."""
        wanted = [int(r) for r in text_rows if r >= 0]
        if not wanted:
            return {}
        marks = ",".join("?" * len(wanted))
        table = (
            "SELECT rowid, terms FROM lexical WHERE rowid"  # format 1
            if self._fts5
            else "SELECT row, terms FROM texts WHERE row"
        )
        with self._lock:
            found = self._db.execute(f"{table} IN ({marks})", wanted)
            return {int(r): t.split() for r, t in found}

    def presence(self, text_rows: np.ndarray, terms: Sequence[str]) -> np.ndarray:
        """(rows, terms) bool: whether each text value holds each analysed term (the coverage feature)."""
        if self._term_hashes is not None:
            return self._term_hashes.presence(text_rows, terms)
        stored = self.terms_of(np.asarray(text_rows).tolist())  # a version written before the hashes
        present = np.zeros((len(text_rows), len(terms)), bool)
        for i, row in enumerate(np.asarray(text_rows).tolist()):
            held = set(stored.get(int(row), ()))
            present[i] = [t in held for t in terms]
        return present

    def texts_of(self, text_rows: Sequence[int]) -> dict[int, tuple[str, str | None, str]]:
        """(field, lang, text) of text values."""
        wanted = [int(r) for r in text_rows if r >= 0]
        if not wanted:
            return {}
        marks = ",".join("?" * len(wanted))
        with self._lock:
            found = self._db.execute(
                f"SELECT row, field, lang, text FROM texts WHERE row IN ({marks})", wanted
            ).fetchall()
        return {int(r): (f, lang, t) for r, f, lang, t in found}

    def photo_paths(self, products: Sequence[int]) -> dict[int, list[str]]:
        """Each product's photo paths, in manifest order (its first photo is the version's own image)."""
        wanted = [int(p) for p in products]
        if not wanted:
            return {}
        marks = ",".join("?" * len(wanted))
        out: dict[int, list[str]] = {p: [] for p in wanted}
        with self._lock:
            for owner, path in self._db.execute(
                f"SELECT owner, path FROM photos WHERE owner IN ({marks}) ORDER BY row", wanted
            ):
                out[int(owner)].append(path)
        return out

    def all_rows(self) -> tuple[PhotoRows, TextRows]:
        """Every photo and text value as written (vectors read into memory): what ``ccrk index add``
        extends into a new version's channels."""
        with self._lock:
            paths = [p for (p,) in self._db.execute("SELECT path FROM photos ORDER BY row")]
            if self._fts5:  # format 1: the terms live in the FTS5 table
                terms = dict(self._db.execute("SELECT rowid, terms FROM lexical"))
                values = [
                    (f, lang, t, terms.get(r, ""))
                    for r, f, lang, t in self._db.execute(
                        "SELECT row, field, lang, text FROM texts ORDER BY row"
                    )
                ]
            else:
                values = list(self._db.execute("SELECT field, lang, text, terms FROM texts ORDER BY row"))
        photos = PhotoRows(
            owners=np.array(self.photos.owners, np.int64),
            paths=paths,
            embeds=np.array(self.photos.vectors, np.float32),
            visual=None if self.visual is None else np.array(self.visual.vectors, np.float32),
        )
        texts = TextRows(
            owners=np.array(self.texts.owners, np.int64),
            fields=[f for f, _, _, _ in values],
            langs=[lang or "und" for _, lang, _, _ in values],
            texts=[t for _, _, t, _ in values],
            terms=[str(terms).split() for _, _, _, terms in values],
            embeds=np.array(self.texts.vectors, np.float32),
        )
        return photos, texts

    def photo_index_of(self, photo_row: int) -> int:
        """A photo row's position among its product's photos (0: the first)."""
        owner = int(self.photos.owners[photo_row])
        return int(photo_row - self.photos.start[owner])
