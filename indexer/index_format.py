"""The on-disk index format, shared by the indexer (writer) and the search service (reader).

Layout::

    INDEX_ROOT/NAME/CURRENT             the published version name, switched atomically
    INDEX_ROOT/NAME/<version>/          immutable once published (version: sortable UTC stamp + suffix)
        manifest.json                   IndexManifest
        index.faiss                     faiss index, inner product on L2-normalised embeddings; ids = rows
        embeddings.npy                  (N, D) float32: exact reference, re-scoring, rebuilds
        rerank_tokens.npy               (N, T, W) float16, or int8 with rerank_scales.npy (N, T) float32
        metadata.sqlite                 items(row, id, path, fields JSON, deleted) + field_names(name)
    INDEX_ROOT/NAME/.builds/...         work dirs of unfinished builds, never read here

A published version is never modified: ``add`` and ``delete`` write a new version (unchanged large files
are hard-linked), so a reader holding an old version keeps a consistent view. This module needs numpy,
faiss and the standard library only (no torch, no model code).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import mmap
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

import faiss
import numpy as np

FORMAT_VERSION = 1

CURRENT_FILE = "CURRENT"
BUILDS_DIR = ".builds"
MANIFEST_FILE = "manifest.json"
INDEX_FILE = "index.faiss"
EMBEDDINGS_FILE = "embeddings.npy"
RERANK_FILE = "rerank_tokens.npy"
RERANK_SCALES_FILE = "rerank_scales.npy"
METADATA_FILE = "metadata.sqlite"

# Allowed-row sets up to this size are searched exactly (a gather + matmul beats a filtered ANN walk, and
# always yields k results).
EXACT_FILTER_MAX = 16_384

_VERSION_RE = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{6}$")
_STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
_RANGE_OPS = {"gte": ">=", "gt": ">", "lte": "<=", "lt": "<"}


class IndexFormatError(RuntimeError):
    """An index on disk is missing, malformed, or does not fit the request."""


class IndexNotFoundError(IndexFormatError):
    """No such index, no published version, or no such version."""


class ModelMismatchError(IndexFormatError):
    """The index was built with another model than the one in use; the message names both."""


class FilterError(IndexFormatError):
    """A metadata filter names an unknown field or has a malformed value; the message names the field."""


@dataclass
class IndexManifest:
    format_version: int
    name: str
    version: str
    created_at: str
    model_name: str
    model_fingerprint: str
    embed_dim: int
    preprocessing: dict[str, Any]
    count: int
    index_factory: str
    search_params: dict[str, Any]
    measured_recall_at_10: float | None
    language_recall_at_10: dict[str, float]
    build_seconds: float
    skipped: list[dict[str, str]]
    checksums: dict[str, str]
    rerank: dict[str, Any]
    parent_version: str | None
    # Additions beyond the shared contract (all defaulted, so older manifests still load).
    total_rows: int = 0  # rows in the files, deleted ones included (count is live rows)
    build_params: dict[str, Any] = field(default_factory=dict)  # e.g. efConstruction, training size
    recall_measured_on: int = 0  # held-out queries behind measured_recall_at_10
    # indexer.match_calibration.MatchCalibration.to_dict(): thresholds of "strong / weak / no match".
    match_calibration: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, ensure_ascii=False, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> IndexManifest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise IndexFormatError(f"manifest is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise IndexFormatError("manifest must be a JSON object")
        fmt = data.get("format_version")
        if not isinstance(fmt, int) or fmt > FORMAT_VERSION:
            raise IndexFormatError(
                f"manifest format_version {fmt!r} is not supported (this code reads up to {FORMAT_VERSION})"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        missing = sorted(required - data.keys())
        if missing:
            raise IndexFormatError(f"manifest lacks field(s) {', '.join(missing)}")
        # Unknown keys come from newer writers of the same format version: ignored, not fatal.
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: Path) -> None:
        _write_atomic(Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path: Path) -> IndexManifest:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise IndexNotFoundError(f"manifest not found: {path}") from None
        try:
            return cls.from_json(text)
        except IndexFormatError as exc:
            raise IndexFormatError(f"{path}: {exc}") from None


# -- files and versions ------------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same folder, fsync, os.replace, fsync the folder: readers see old or new, never
    a torn file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _fsync_dir(path.parent)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_checksums(version_dir: Path) -> dict[str, str]:
    """sha256 of every data file of a version folder (the manifest itself excluded)."""
    return {
        p.name: sha256_file(p)
        for p in sorted(Path(version_dir).iterdir())
        if p.is_file() and p.name != MANIFEST_FILE and not p.name.startswith(".")
    }


@lru_cache(maxsize=16)
def _fingerprint_cached(paths: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for path, _, _ in paths:
        digest.update(Path(path).name.encode())
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def model_fingerprint(model_dir: Path) -> str:
    """sha256 over config.json + model.safetensors (whichever exist; cached per file size and mtime)."""
    model_dir = Path(model_dir)
    files = [model_dir / n for n in ("config.json", "model.safetensors") if (model_dir / n).is_file()]
    if not files:
        raise IndexFormatError(f"{model_dir} holds neither config.json nor model.safetensors")
    key = tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _fingerprint_cached(key)


def model_name_of(model_dir: Path) -> str:
    """The name a manifest records for a model: its folder name (e.g. ``ccrk-demo``)."""
    return Path(model_dir).resolve().name


def index_dir(root: Path, name: str) -> Path:
    if not name or "/" in name or name.startswith(".") or name != name.strip():
        raise IndexFormatError(f"invalid index name {name!r}")
    return Path(root) / name


def is_version_name(text: str) -> bool:
    return bool(_VERSION_RE.match(text))


def new_version_name(root: Path, name: str, now: datetime | None = None) -> str:
    """A fresh version name that sorts after every existing one (the stamp is bumped on a clash)."""
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    existing = list_versions(root, name)
    builds = index_dir(root, name) / BUILDS_DIR
    if existing:
        last = datetime.strptime(existing[-1][:16], _STAMP_FORMAT).replace(tzinfo=UTC)
        if last >= now:
            now = last + timedelta(seconds=1)
    candidate = f"{now.strftime(_STAMP_FORMAT)}-{secrets.token_hex(3)}"
    while (index_dir(root, name) / candidate).exists() or (builds / candidate).exists():
        candidate = f"{now.strftime(_STAMP_FORMAT)}-{secrets.token_hex(3)}"
    return candidate


def current_version(root: Path, name: str) -> str | None:
    path = index_dir(root, name) / CURRENT_FILE
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return text or None


def list_versions(root: Path, name: str) -> list[str]:
    """Installed versions, oldest first: published ones and those the quality gate refused (kept, never
    published; ``refused_by_gate``)."""
    base = index_dir(root, name)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if is_version_name(p.name) and (p / MANIFEST_FILE).is_file())


def refused_by_gate(manifest: IndexManifest) -> bool:
    """Whether the builder's quality gate refused this version: it was installed (kept for inspection) but
    never published, so nothing may publish it by default or count it as a good version."""
    gate = manifest.build_params.get("quality_gate")
    return isinstance(gate, dict) and gate.get("passed") is False


def version_refused(root: Path, name: str, version: str) -> bool:
    """``refused_by_gate`` of a kept version; IndexFormatError when its manifest cannot be read."""
    return refused_by_gate(IndexManifest.load(index_dir(root, name) / version / MANIFEST_FILE))


def version_approved(root: Path, name: str, version: str) -> bool:
    """Not refused by the quality gate (a version built with the gate off counts as approved). An unreadable
    manifest counts as not approved: it must never be picked over, or keep its place instead of, a good
    version."""
    try:
        return not version_refused(root, name, version)
    except IndexFormatError:
        return False


def publish_version(root: Path, name: str, version: str) -> None:
    """Switch CURRENT to ``version`` atomically; the version folder must be complete already."""
    base = index_dir(root, name)
    if not (base / version / MANIFEST_FILE).is_file():
        raise IndexNotFoundError(f"cannot publish {name}/{version}: no such complete version under {base}")
    _write_atomic(base / CURRENT_FILE, (version + "\n").encode("utf-8"))


def install_version(root: Path, name: str, staged_dir: Path, version: str) -> Path:
    """Move a fully written version folder into place (one rename, same filesystem) without publishing it."""
    base = index_dir(root, name)
    base.mkdir(parents=True, exist_ok=True)
    staged_dir = Path(staged_dir)
    for p in staged_dir.iterdir():
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(staged_dir)
    target = base / version
    os.rename(staged_dir, target)
    _fsync_dir(base)
    return target


def prune_versions(root: Path, name: str, keep: int) -> list[str]:
    """Keep the newest ``keep`` approved versions, the newest ``keep`` versions the quality gate refused
    (or whose manifest is unreadable), and CURRENT whatever it is; delete the rest. Returns the deleted
    names, oldest first. Counted separately so that refused builds never push good versions out.

    A reader may still have a deleted version open: its memory maps and open files stay valid (POSIX)."""
    import shutil

    current = current_version(root, name)
    versions = list_versions(root, name)
    ok = {v: version_approved(root, name, v) for v in versions}
    approved = [v for v in versions if ok[v]]
    refused = [v for v in versions if not ok[v]]
    kept = {current, *approved[max(0, len(approved) - keep) :], *refused[max(0, len(refused) - keep) :]}
    doomed = [v for v in versions if v not in kept]
    base = index_dir(root, name)
    for v in doomed:
        # Renamed first so list_versions never reports a half-deleted folder.
        trash = base / BUILDS_DIR / f"trash-{v}-{secrets.token_hex(3)}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.rename(base / v, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return doomed


# -- metadata ------------------------------------------------------------------------------------------------


METADATA_SCHEMA = """
CREATE TABLE items(
    row INTEGER PRIMARY KEY,
    id TEXT UNIQUE NOT NULL,
    path TEXT,
    fields TEXT,
    deleted INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE field_names(name TEXT PRIMARY KEY);
"""


def field_expr(name: str) -> str:
    """SQL expression of one metadata field (a literal JSON path, so expression indexes can serve it)."""
    if '"' in name or any(ord(c) < 32 for c in name) or not name:
        raise FilterError(f"invalid field name {name!r}")
    return "json_extract(fields, '$.\"" + name.replace("'", "''") + "\"')"


def write_metadata(path: Path, items: Iterable[tuple[int, str, str | None, dict[str, Any], bool]]) -> None:
    """Write metadata.sqlite from (row, id, path, fields, deleted) tuples, with an index per field."""
    path = Path(path)
    if path.exists():
        path.unlink()
    con = sqlite3.connect(path)
    try:
        con.executescript(METADATA_SCHEMA)
        names: set[str] = set()

        def rows() -> Iterable[tuple[int, str, str | None, str, int]]:
            for row, item_id, item_path, fields, deleted in items:
                names.update(fields)
                yield row, item_id, item_path, json.dumps(fields, ensure_ascii=False), int(deleted)

        con.executemany("INSERT INTO items(row, id, path, fields, deleted) VALUES (?, ?, ?, ?, ?)", rows())
        con.executemany("INSERT INTO field_names(name) VALUES (?)", [(n,) for n in sorted(names)])
        for i, n in enumerate(sorted(names)[:64]):
            con.execute(f"CREATE INDEX ix_field_{i} ON items({field_expr(n)})")
        con.commit()
    finally:
        con.close()


def read_metadata(path: Path) -> list[tuple[int, str, str | None, dict[str, Any], bool]]:
    """All (row, id, path, fields, deleted) of a metadata.sqlite, by row (for add/delete/rebuilds)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [
            (r, i, p, json.loads(f) if f else {}, bool(d))
            for r, i, p, f, d in con.execute("SELECT row, id, path, fields, deleted FROM items ORDER BY row")
        ]
    finally:
        con.close()


# -- reading one version -----------------------------------------------------------------------------------


def _topk_merge(
    best_s: np.ndarray, best_r: np.ndarray, scores: np.ndarray, rows: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Merge candidate (Q, m) scores/rows into the running (Q, k) best; ties broken by lower row."""
    all_s = np.concatenate([best_s, scores], axis=1)
    all_r = np.concatenate([best_r, rows], axis=1)
    width = all_s.shape[1]
    if width <= 4 * k:
        order = np.lexsort((_tie_key(all_r), -all_s), axis=-1)[:, :k]
        return np.take_along_axis(all_s, order, 1), np.take_along_axis(all_r, order, 1)
    # Sorting every candidate dominated exact search: keep those at or above each row's k-th best score
    # (ties at the boundary included, so the tie-break stays exact), then sort only them.
    kth = np.partition(all_s, width - k, axis=1)[:, width - k]
    out_s = np.empty((all_s.shape[0], k), dtype=all_s.dtype)
    out_r = np.empty((all_s.shape[0], k), dtype=all_r.dtype)
    for q in range(all_s.shape[0]):
        keep = np.flatnonzero(all_s[q] >= kth[q])
        s, r = all_s[q, keep], all_r[q, keep]
        order = np.lexsort((_tie_key(r), -s))[:k]
        out_s[q], out_r[q] = s[order], r[order]
    return out_s, out_r


def _tie_key(rows: np.ndarray) -> np.ndarray:
    """Padding rows (-1) sort after every real row among equal scores."""
    return np.where(rows < 0, np.iinfo(np.int64).max, rows)


def _random_access(array: np.ndarray) -> np.ndarray:
    """Tell the kernel a memory-mapped store is read at random rows (MADV_RANDOM): re-ranking reads 128
    scattered rows per query, and the default readahead around each one read megabytes per row (measured on
    a 1M-item fp16 store not yet in the page cache: 2 s for 128 rows, 5 ms with the advice). numpy keeps
    the mapping in the private ``_mmap``; without it (or on a platform without madvise) nothing changes."""
    mapping = getattr(array, "_mmap", None)
    if mapping is not None and hasattr(mmap, "MADV_RANDOM"):
        with contextlib.suppress(OSError, ValueError):
            mapping.madvise(mmap.MADV_RANDOM)
    return array


class IndexVersion:
    """One opened, read-only version of an index. Thread-safe for concurrent searches."""

    manifest: IndexManifest
    path: Path
    # Allowed-row sets up to this size are searched exactly (class attribute so tests can lower it).
    exact_filter_max: int = EXACT_FILTER_MAX

    def __init__(self, path: Path, manifest: IndexManifest) -> None:
        self.path = Path(path)
        self.manifest = manifest
        try:
            self._index = faiss.read_index(str(self.path / INDEX_FILE))
            self._embeds = np.load(self.path / EMBEDDINGS_FILE, mmap_mode="r")
        except (OSError, RuntimeError, ValueError) as exc:
            raise IndexFormatError(f"cannot read index files of {self.path}: {exc}") from exc
        n = int(self._embeds.shape[0])
        if self._embeds.ndim != 2 or self._embeds.shape[1] != manifest.embed_dim:
            raise IndexFormatError(
                f"{self.path / EMBEDDINGS_FILE} has shape {self._embeds.shape}, manifest says dim "
                f"{manifest.embed_dim}"
            )
        if self._index.ntotal != n or self._index.d != manifest.embed_dim:
            raise IndexFormatError(
                f"{self.path / INDEX_FILE} holds {self._index.ntotal} vectors of dim {self._index.d}, "
                f"embeddings.npy {n} of dim {manifest.embed_dim}"
            )
        self._n = n
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            f"file:{self.path / METADATA_FILE}?mode=ro&immutable=1", uri=True, check_same_thread=False
        )
        deleted = np.fromiter(
            (r for (r,) in self._db.execute("SELECT row FROM items WHERE deleted != 0")), dtype=np.int64
        )
        self._live: np.ndarray | None = None
        self._live_bitmap: np.ndarray | None = None
        if deleted.size:
            live = np.ones(n, dtype=bool)
            live[deleted[(deleted >= 0) & (deleted < n)]] = False
            self._live = live
            self._live_bitmap = np.packbits(live, bitorder="little")
        self._count = n - int(deleted.size)
        try:
            self._fields = {r for (r,) in self._db.execute("SELECT name FROM field_names")}
        except sqlite3.OperationalError:
            self._fields = {
                r for (r,) in self._db.execute("SELECT DISTINCT key FROM items, json_each(items.fields)")
            }
        rerank_file = self.path / RERANK_FILE
        self._tokens = _random_access(np.load(rerank_file, mmap_mode="r")) if rerank_file.is_file() else None
        scales = self.path / RERANK_SCALES_FILE
        self._scales = _random_access(np.load(scales, mmap_mode="r")) if scales.is_file() else None
        self._ivf = faiss.try_extract_index_ivf(self._index)
        self._hnsw = isinstance(self._index, faiss.IndexHNSW)
        self._flat = isinstance(self._index, faiss.IndexFlat)
        self.set_search_params(manifest.search_params or {})

    def set_search_params(self, params: dict[str, Any]) -> None:
        """Apply search parameters (efSearch, nprobe, rescore_factor); the manifest's are applied at open.
        The indexer tunes through this, so measured recall is what ``search`` delivers."""
        self._rescore = int(params.get("rescore_factor", 0) or 0)
        if self._ivf is not None and params.get("nprobe"):
            self._ivf.nprobe = int(params["nprobe"])
        if self._hnsw and params.get("efSearch"):
            self._index.hnsw.efSearch = int(params["efSearch"])

    # -- opening ----------------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        root: Path,
        name: str,
        version: str | None = None,
        *,
        expect_fingerprint: str | None = None,
        expect_model_name: str | None = None,
    ) -> IndexVersion:
        """Open ``version`` (default: the one CURRENT names). With ``expect_*``, refuse an index built with
        another model (ModelMismatchError naming both)."""
        base = index_dir(root, name)
        attempts = 3 if version is None else 1
        for attempt in range(attempts):
            chosen = version or current_version(root, name)
            if chosen is None:
                raise IndexNotFoundError(f"index {name!r} has no published version under {base}")
            path = base / chosen
            try:
                manifest = IndexManifest.load(path / MANIFEST_FILE)
                check_model(
                    manifest, expect_fingerprint=expect_fingerprint, expect_model_name=expect_model_name
                )
                return cls(path, manifest)
            except ModelMismatchError:
                raise
            except IndexFormatError:
                # CURRENT moved on and the version it named was pruned while we read it: read CURRENT again.
                if path.is_dir() or attempt + 1 >= attempts:
                    if not path.is_dir():
                        raise IndexNotFoundError(
                            f"index {name!r} has no version {chosen!r} under {base}"
                        ) from None
                    raise
                time.sleep(0.01)
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._db.close()
        self._index = None  # type: ignore[assignment]
        self._embeds = None  # type: ignore[assignment]
        self._tokens = None
        self._scales = None

    def __enter__(self) -> IndexVersion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self._count

    @property
    def index_kind(self) -> str:
        """hnsw, ivf, flat, or other (a factory override this module cannot parameterise)."""
        if self._hnsw:
            return "hnsw"
        if self._ivf is not None:
            return "ivf"
        return "flat" if self._flat else "other"

    @property
    def ivf_nlist(self) -> int:
        return int(self._ivf.nlist) if self._ivf is not None else 0

    @property
    def total_rows(self) -> int:
        """Rows in the files, deleted ones included."""
        return self._n

    # -- search ------------------------------------------------------------------------------------------

    def _queries(self, queries: np.ndarray, k: int) -> np.ndarray:
        q = np.ascontiguousarray(np.atleast_2d(np.asarray(queries, dtype=np.float32)))
        if q.ndim != 2 or q.shape[1] != self.manifest.embed_dim:
            raise IndexFormatError(f"queries must be (Q, {self.manifest.embed_dim}), got {q.shape}")
        if k < 1:
            raise IndexFormatError(f"k must be >= 1, got {k}")
        return q

    def _allowed(self, allowed_rows: np.ndarray) -> np.ndarray:
        rows = np.unique(np.asarray(allowed_rows, dtype=np.int64).ravel())
        rows = rows[(rows >= 0) & (rows < self._n)]
        if self._live is not None:
            rows = rows[self._live[rows]]
        return rows

    def _exact_rows(self, q: np.ndarray, k: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        best_s = np.full((q.shape[0], k), -np.inf, dtype=np.float32)
        best_r = np.full((q.shape[0], k), -1, dtype=np.int64)
        for start in range(0, rows.size, 65_536):
            chunk = rows[start : start + 65_536]
            scores = q @ np.asarray(self._embeds[chunk]).T
            best_s, best_r = _topk_merge(best_s, best_r, scores, np.broadcast_to(chunk, scores.shape), k)
        return best_s, best_r

    def search_exact(
        self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Brute-force inner product over live (and allowed) rows: the reference for the ANN index."""
        q = self._queries(queries, k)
        if allowed_rows is not None:
            return self._exact_rows(q, k, self._allowed(allowed_rows))
        best_s = np.full((q.shape[0], k), -np.inf, dtype=np.float32)
        best_r = np.full((q.shape[0], k), -1, dtype=np.int64)
        for start in range(0, self._n, 65_536):
            block = np.asarray(self._embeds[start : start + 65_536])
            scores = q @ block.T
            rows = np.arange(start, start + block.shape[0], dtype=np.int64)
            if self._live is not None:
                scores[:, ~self._live[start : start + block.shape[0]]] = -np.inf
                rows_b = np.where(self._live[start : start + block.shape[0]], rows, -1)
            else:
                rows_b = rows
            best_s, best_r = _topk_merge(best_s, best_r, scores, np.broadcast_to(rows_b, scores.shape), k)
        best_r[~np.isfinite(best_s)] = -1
        return best_s, best_r

    def _params(self, selector: Any) -> Any:
        if self._hnsw:
            p = faiss.SearchParametersHNSW()
            p.efSearch = self._index.hnsw.efSearch
        elif self._ivf is not None and self._ivf is self._index:
            p = faiss.SearchParametersIVF()
            p.nprobe = self._ivf.nprobe
        elif self._flat:
            p = faiss.SearchParameters()
        else:
            return None  # a wrapper this module cannot parameterise: callers fall back to exact search
        if selector is not None:
            p.sel = selector
        return p

    def search(
        self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """ANN search with the tuned parameters; deleted rows never come back. Returns (Q, k) scores and
        rows, padded with -inf / -1. With ``allowed_rows`` (a filter), k results come back whenever k
        allowed live rows exist."""
        q = self._queries(queries, k)
        allowed: np.ndarray | None = None
        if allowed_rows is not None:
            allowed = self._allowed(allowed_rows)
            if allowed.size <= max(self.exact_filter_max, k) or self._flat:
                return self._exact_rows(q, k, allowed)
            selector: Any = faiss.IDSelectorBatch(allowed)
        elif self._live is not None:
            selector = faiss.IDSelectorBitmap(self._n, faiss.swig_ptr(self._live_bitmap))
        else:
            selector = None
        kc = max(k, k * self._rescore) if self._rescore else k
        kc = min(kc, max(1, self._n))
        params = self._params(selector)
        if params is None and selector is not None:
            target = allowed if allowed is not None else np.flatnonzero(self._live)
            return self._exact_rows(q, k, target)
        if params is None:
            scores, rows = self._index.search(q, kc)
        else:
            if self._hnsw:
                # A filtered walk keeps only the allowed share of what it visits: widen the beam to match.
                share = allowed.size / max(1, self._count) if allowed is not None else 1.0
                params.efSearch = max(min(int(params.efSearch / max(share, 1e-3)), 1024), kc)
            scores, rows = self._index.search(q, kc, params=params)
        rows = rows.astype(np.int64, copy=False)
        if self._rescore:
            scores, rows = self._rescore_rows(q, rows, k)
        else:
            scores, rows = scores[:, :k], rows[:, :k]
        scores = np.where(rows < 0, -np.inf, scores).astype(np.float32)
        # A filtered graph walk can come back short; finish those queries exactly so k results arrive.
        want = min(k, allowed.size if allowed is not None else self._count)
        short = np.flatnonzero((rows >= 0).sum(axis=1) < want)
        if short.size:
            target = (
                allowed
                if allowed is not None
                else (np.flatnonzero(self._live) if self._live is not None else np.arange(self._n))
            )
            s2, r2 = self._exact_rows(q[short], k, target)
            scores[short], rows[short] = s2, r2
        return scores, rows

    def _rescore_rows(self, q: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact inner products of the ANN candidates from embeddings.npy, re-sorted."""
        safe = np.where(rows < 0, 0, rows)
        flat = np.unique(safe)
        vecs = np.asarray(self._embeds[flat])
        pos = np.searchsorted(flat, safe)
        scores = np.einsum("qd,qcd->qc", q, vecs[pos])
        scores = np.where(rows < 0, -np.inf, scores).astype(np.float32)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)

    # -- re-rank store and metadata ----------------------------------------------------------------------

    def rerank_tokens(self, rows: np.ndarray) -> np.ndarray:
        """(n, T, W) float32 patch tokens of the given rows, read from the memory-mapped store."""
        if self._tokens is None:
            raise IndexFormatError(f"{self.path} has no re-rank store ({RERANK_FILE})")
        rows = np.asarray(rows, dtype=np.int64).ravel()
        if rows.size and (rows.min() < 0 or rows.max() >= self._n):
            raise IndexFormatError(f"rows out of range 0..{self._n - 1}")
        tokens = np.asarray(self._tokens[rows], dtype=np.float32)
        if self._scales is not None:
            tokens *= np.asarray(self._scales[rows], dtype=np.float32)[..., None]
        return tokens

    def items(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        """{"id", "path", **fields} per row, in the given order; an unknown row raises IndexFormatError."""
        wanted = [int(r) for r in rows]
        found: dict[int, dict[str, Any]] = {}
        with self._lock:
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for row, item_id, path, fields in self._db.execute(
                    f"SELECT row, id, path, fields FROM items WHERE row IN ({marks})", chunk
                ):
                    found[row] = {"id": item_id, "path": path, **(json.loads(fields) if fields else {})}
        missing = [r for r in wanted if r not in found]
        if missing:
            raise IndexFormatError(f"unknown rows {missing[:5]} in {self.path}")
        return [found[r] for r in wanted]

    def row_of(self, item_id: str) -> int | None:
        with self._lock:
            hit = self._db.execute(
                "SELECT row FROM items WHERE id = ? AND deleted = 0", (item_id,)
            ).fetchone()
        return None if hit is None else int(hit[0])

    @property
    def fields(self) -> set[str]:
        """Metadata field names that filters may use."""
        return set(self._fields)

    def filter_rows(self, filters: dict[str, Any]) -> np.ndarray:
        """Sorted live rows matching every filter: {field: value} equality, {field: [v1, v2]} any-of,
        {field: {"gte": x, "lte": y}} numeric range (also gt/lt)."""
        clauses: list[str] = ["deleted = 0"]
        args: list[Any] = []
        for name, cond in filters.items():
            if name not in self._fields:
                known = ", ".join(sorted(self._fields)) or "none"
                raise FilterError(f"unknown filter field {name!r} (known fields: {known})")
            expr = field_expr(name)
            if isinstance(cond, dict):
                if not cond or set(cond) - _RANGE_OPS.keys():
                    raise FilterError(
                        f"filter on {name!r}: range keys must be among gte, gt, lte, lt, got {sorted(cond)}"
                    )
                for op, value in cond.items():
                    if isinstance(value, bool) or not isinstance(value, int | float):
                        raise FilterError(f"filter on {name!r}: {op} needs a number, got {value!r}")
                    clauses.append(f"typeof({expr}) IN ('integer', 'real') AND {expr} {_RANGE_OPS[op]} ?")
                    args.append(value)
            elif isinstance(cond, list | tuple):
                if not cond or not all(isinstance(v, str | int | float | bool) for v in cond):
                    raise FilterError(f"filter on {name!r}: any-of needs a non-empty list of scalars")
                clauses.append(f"{expr} IN ({','.join('?' * len(cond))})")
                args.extend(cond)
            elif isinstance(cond, str | int | float | bool):
                clauses.append(f"{expr} = ?")
                args.append(cond)
            else:
                raise FilterError(f"filter on {name!r}: unsupported value {cond!r}")
        sql = f"SELECT row FROM items WHERE {' AND '.join(clauses)} ORDER BY row"
        with self._lock:
            return np.fromiter((r for (r,) in self._db.execute(sql, args)), dtype=np.int64)


# -- model compatibility and verification --------------------------------------------------------------------


def check_model(
    manifest: IndexManifest,
    *,
    expect_fingerprint: str | None = None,
    expect_model_name: str | None = None,
) -> None:
    """Raise ModelMismatchError (naming both models) when the index was built with another model.

    The fingerprint decides when given (same weights under another folder name are compatible); the name
    (``model_name_of(model_dir)``, the folder name) is compared only without a fingerprint."""
    if expect_fingerprint is not None:
        bad = expect_fingerprint != manifest.model_fingerprint
    else:
        bad = expect_model_name is not None and expect_model_name != manifest.model_name
    if bad:
        theirs = f"{expect_model_name or '?'}" + (
            f" (fingerprint {expect_fingerprint[:12]})" if expect_fingerprint else ""
        )
        raise ModelMismatchError(
            f"index {manifest.name}/{manifest.version} was built with model {manifest.model_name!r} "
            f"(fingerprint {manifest.model_fingerprint[:12]}), but the model in use is {theirs}; "
            "rebuild the index with this model or use the model it was built with"
        )


def verify_version(
    root: Path, name: str, version: str | None = None, *, model_dir: Path | None = None
) -> list[str]:
    """Problems found in one version (checksums, counts, shapes, model compatibility); [] when sound."""
    chosen = version or current_version(root, name)
    if chosen is None:
        return [f"index {name!r} has no published version"]
    path = index_dir(root, name) / chosen
    try:
        manifest = IndexManifest.load(path / MANIFEST_FILE)
    except IndexFormatError as exc:
        return [str(exc)]
    problems: list[str] = []
    for fname, expected in manifest.checksums.items():
        fpath = path / fname
        if not fpath.is_file():
            problems.append(f"{fname}: missing")
        elif sha256_file(fpath) != expected:
            problems.append(f"{fname}: checksum mismatch")
    if problems:
        return problems
    try:
        with IndexVersion(path, manifest) as opened:
            if len(opened) != manifest.count:
                problems.append(f"manifest count {manifest.count} but {len(opened)} live items")
            if opened._tokens is not None and opened._tokens.shape[0] != opened.total_rows:
                problems.append(
                    f"re-rank store has {opened._tokens.shape[0]} rows, index {opened.total_rows}"
                )
            with opened._lock:
                (n_meta,) = opened._db.execute("SELECT COUNT(*) FROM items").fetchone()
            if n_meta != opened.total_rows:
                problems.append(f"metadata has {n_meta} rows, index {opened.total_rows}")
    except IndexFormatError as exc:
        problems.append(str(exc))
    if model_dir is not None:
        try:
            check_model(
                manifest,
                expect_fingerprint=model_fingerprint(model_dir),
                expect_model_name=model_name_of(model_dir),
            )
        except ModelMismatchError as exc:
            problems.append(str(exc))
    return problems
