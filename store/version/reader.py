"""Reading one version: the query engine ``IndexVersion`` (ANN and exact search, filtered search, exact
re-scoring, deleted rows, re-rank tokens, item metadata) and ``SearchableIndex``, the surface the service,
monitoring and the indexer's tuning search through (``store.shards.sharded.ShardedIndex`` implements it over
the
shards of a sharded version; ``store.opening.open_version`` opens either kind).

A little over 400 lines: the one reader of a version's files, its product channels opened beside them
(``store.products.channels``)."""

from __future__ import annotations

import contextlib
import mmap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import faiss
import numpy as np

from store.errors import IndexFormatError, IndexNotFoundError, ModelMismatchError
from store.guard import FileGuard
from store.layout import (
    EMBEDDINGS_FILE,
    FORMAT_VERSION,
    INDEX_FILE,
    MANIFEST_FILE,
    METADATA_FILE,
    RERANK_FILE,
    RERANK_SCALES_FILE,
    index_dir,
)
from store.products.channels import ProductChannels, has_product_channels
from store.version import exact
from store.version.manifest import IndexManifest, check_model
from store.version.metadata import MetadataReader
from store.version.versions import current_version

# Allowed-row sets up to this size are searched exactly (a gather + matmul beats a filtered ANN walk, and
# always yields k results).
EXACT_FILTER_MAX = 16_384


def check_queries(queries: np.ndarray, k: int, embed_dim: int) -> np.ndarray:
    """Queries as a C-contiguous (Q, embed_dim) float32 array; IndexFormatError for another shape or k < 1.
    Every ``SearchableIndex`` checks its search arguments through this."""
    q = np.ascontiguousarray(np.atleast_2d(np.asarray(queries, dtype=np.float32)))
    if q.ndim != 2 or q.shape[1] != embed_dim:
        raise IndexFormatError(f"queries must be (Q, {embed_dim}), got {q.shape}")
    if k < 1:
        raise IndexFormatError(f"k must be >= 1, got {k}")
    return q


@runtime_checkable
class SearchableIndex(Protocol):
    """What searching an index needs, whatever its files: one version (``IndexVersion``) or shards of one.
    Rows are the index's item numbers; results are (Q, k) scores and rows, padded with -inf / -1."""

    @property
    def manifest(self) -> IndexManifest: ...

    @property
    def version(self) -> str: ...

    def __len__(self) -> int: ...  # live items

    @property
    def fields(self) -> set[str]: ...

    def search(
        self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def search_exact(
        self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def filter_rows(self, filters: dict[str, Any]) -> np.ndarray: ...

    def items(self, rows: Sequence[int]) -> list[dict[str, Any]]: ...

    def row_of(self, item_id: str) -> int | None: ...

    def rerank_tokens(self, rows: np.ndarray) -> np.ndarray: ...


Opened = TypeVar("Opened")


def open_named(
    root: Path,
    name: str,
    version: str | None,
    opener: Callable[[Path, IndexManifest], Opened],
    *,
    expect_fingerprint: str | None = None,
    expect_model_name: str | None = None,
) -> Opened:
    """``opener(path, manifest)`` of ``version`` (default: the one CURRENT names), after the model check.
    CURRENT is read again (up to 3 times) when the version it named was pruned while being opened."""
    base = index_dir(root, name)
    attempts = 3 if version is None else 1
    for attempt in range(attempts):
        chosen = version or current_version(root, name)
        if chosen is None:
            raise IndexNotFoundError(f"index {name!r} has no published version under {base}")
        path = base / chosen
        try:
            manifest = IndexManifest.load(path / MANIFEST_FILE)
            check_model(manifest, expect_fingerprint=expect_fingerprint, expect_model_name=expect_model_name)
            return opener(path, manifest)
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
    """One opened, read-only version of an index (a ``SearchableIndex``). Thread-safe for concurrent
    searches."""

    manifest: IndexManifest
    path: Path
    # Allowed-row sets up to this size are searched exactly (class attribute so tests can lower it).
    exact_filter_max: int = EXACT_FILTER_MAX

    def __init__(self, path: Path, manifest: IndexManifest) -> None:
        self.path = Path(path)
        self.manifest = manifest
        if manifest.is_sharded or manifest.format_version > FORMAT_VERSION:
            raise IndexFormatError(
                f"{self.path} is a sharded version (manifest format_version {manifest.format_version}): open "
                "it with store.opening.open_version, or open one of its shard folders"
            )
        # Every file read after the open, sizes checked before mapping and watched while served.
        self._guard = FileGuard()
        try:
            self._open_files(manifest)
        except BaseException:
            products = getattr(self, "products", None)
            if products is not None:
                products.close()
            self._guard.close()  # its leases would hold a truncation of these files back
            raise

    def _open_files(self, manifest: IndexManifest) -> None:
        try:
            self._index = faiss.read_index(str(self.path / INDEX_FILE))
            self._embeds = self._guard.map_array(self.path / EMBEDDINGS_FILE)
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
        self._guard.watch(self.path / METADATA_FILE)
        self._meta = MetadataReader(self.path / METADATA_FILE)
        deleted = self._meta.deleted_rows()
        self._live: np.ndarray | None = None
        self._live_bitmap: np.ndarray | None = None
        if deleted.size:
            live = np.ones(n, dtype=bool)
            live[deleted[(deleted >= 0) & (deleted < n)]] = False
            self._live = live
            self._live_bitmap = np.packbits(live, bitorder="little")
        self._count = n - int(deleted.size)
        self._fields = self._meta.field_names()
        rerank_file = self.path / RERANK_FILE
        self._tokens = _random_access(self._guard.map_array(rerank_file)) if rerank_file.is_file() else None
        scales = self.path / RERANK_SCALES_FILE
        self._scales = _random_access(self._guard.map_array(scales)) if scales.is_file() else None
        # Products with several photos or searched text fields (``store.products.channels``); None for every
        # version
        # written without them, which is searched exactly as before.
        self.products: ProductChannels | None = (
            ProductChannels(self.path, n) if has_product_channels(self.path) else None
        )
        self._ivf = faiss.try_extract_index_ivf(self._index)
        self._hnsw = isinstance(self._index, faiss.IndexHNSW)
        self._flat = isinstance(self._index, faiss.IndexFlat)
        self._plain_params: dict[int, Any] = {}  # ``_walk_params``, by efSearch
        try:
            self.set_search_params(manifest.search_params or {})
        except (
            TypeError,
            ValueError,
            OverflowError,
            AttributeError,
        ) as exc:  # hand-edited: Infinity, "x", []
            raise IndexFormatError(
                f"{self.path}: unusable search_params {manifest.search_params!r:.200}: {exc}"
            ) from exc

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
        """Open ``version`` (default: the one CURRENT names), which must be unsharded
        (``store.opening.open_version`` opens either kind). With ``expect_*``, refuse an index built with
        another model (ModelMismatchError naming both)."""
        return open_named(
            root,
            name,
            version,
            cls,
            expect_fingerprint=expect_fingerprint,
            expect_model_name=expect_model_name,
        )

    def close(self) -> None:
        self._meta.close()
        if self.products is not None:
            self.products.close()
        self._index = None  # type: ignore[assignment]
        self._embeds = None  # type: ignore[assignment]
        self._tokens = None
        self._scales = None
        self._guard.close()

    def damage(self) -> str | None:
        """What is wrong with the version's files since its open (``store.guard``: truncated, being opened
        for writing), None when nothing: a few syscalls, asked before each request reads them."""
        problem = self._guard.problem()
        if problem is None and self.products is not None:
            problem = self.products.damage()
        return problem

    def __enter__(self) -> IndexVersion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self._count

    @property
    def version(self) -> str:
        return self.manifest.version

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

    @property
    def rerank_rows(self) -> int | None:
        """Rows of the re-rank store (None: the version has none); verification compares them."""
        return None if self._tokens is None else int(self._tokens.shape[0])

    @property
    def metadata_rows(self) -> int:
        """Rows of metadata.sqlite, deleted ones included; verification compares them."""
        return self._meta.row_count()

    # -- search ------------------------------------------------------------------------------------------

    def _allowed(self, allowed_rows: np.ndarray) -> np.ndarray:
        rows = exact.sorted_distinct(allowed_rows)
        rows = rows[(rows >= 0) & (rows < self._n)]
        if self._live is not None:
            rows = rows[self._live[rows]]
        return rows

    def _exact_rows(self, q: np.ndarray, k: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return exact.exact_rows(self._embeds, q, k, rows)

    def search_exact(
        self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Brute-force inner product over live (and allowed) rows: the reference for the ANN index."""
        q = check_queries(queries, k, self.manifest.embed_dim)
        if allowed_rows is not None:
            return self._exact_rows(q, k, self._allowed(allowed_rows))
        return exact.exact_all(self._embeds, q, k, self._live)

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

    def _walk_params(self, kc: int) -> Any:
        """The parameters of an HNSW walk over every row (no filter, nothing deleted): one object per beam
        width, made once and kept (faiss only reads it; making one per query cost ~5 us of Python)."""
        ef = max(min(self._index.hnsw.efSearch, 1024), kc)
        params = self._plain_params.get(ef)
        if params is None:
            params = faiss.SearchParametersHNSW()
            params.efSearch = ef
            self._plain_params[ef] = params
        return params

    def search(
        self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """ANN search with the tuned parameters; deleted rows never come back. Returns (Q, k) scores and
        rows, padded with -inf / -1. With ``allowed_rows`` (a filter), k results come back whenever k
        allowed live rows exist."""
        q = check_queries(queries, k, self.manifest.embed_dim)
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
        params = self._params(selector) if selector is not None or not self._hnsw else self._walk_params(kc)
        if params is None and selector is not None:
            target = allowed if allowed is not None else np.flatnonzero(self._live)
            return self._exact_rows(q, k, target)
        if params is None:
            scores, rows = self._index.search(q, kc)
        else:
            if self._hnsw and selector is not None:
                # A filtered walk keeps only the allowed share of what it visits: widen the beam to match.
                share = allowed.size / max(1, self._count) if allowed is not None else 1.0
                params.efSearch = max(min(int(params.efSearch / max(share, 1e-3)), 1024), kc)
            scores, rows = self._index.search(q, kc, params=params)
        rows = rows.astype(np.int64, copy=False)
        if self._rescore:
            scores, rows = exact.rescore(self._embeds, q, rows, k)
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

    def live_mask(self) -> np.ndarray | None:
        """(N,) bool, False for deleted rows; None when no row is deleted."""
        return self._live

    def embeddings(self, rows: np.ndarray) -> np.ndarray:
        """(n, D) float32 stored embeddings of the given rows (held-out queries, re-scoring)."""
        rows = np.asarray(rows, dtype=np.int64).ravel()
        if rows.size and (rows.min() < 0 or rows.max() >= self._n):
            raise IndexFormatError(f"rows out of range 0..{self._n - 1}")
        return np.asarray(self._embeds[rows], dtype=np.float32)

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
        found = self._meta.items(wanted)
        missing = [r for r in wanted if r not in found]
        if missing:
            raise IndexFormatError(f"unknown rows {missing[:5]} in {self.path}")
        return [found[r] for r in wanted]

    def row_of(self, item_id: str) -> int | None:
        return self._meta.row_of(item_id)

    @property
    def fields(self) -> set[str]:
        """Metadata field names that filters may use."""
        return set(self._fields)

    def filter_rows(self, filters: dict[str, Any]) -> np.ndarray:
        """Sorted live rows matching every filter: {field: value} equality, {field: [v1, v2]} any-of,
        {field: {"gte": x, "lte": y}} numeric range (also gt/lt)."""
        return self._meta.rows_matching(filters, self._fields)

    def field_kinds(self, name: str) -> set[str]:
        """The kinds of value field ``name`` holds in the live rows (``store.version.metadata.kind_of``)."""
        return self._meta.field_kinds(name) if name in self._fields else set()
