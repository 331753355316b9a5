"""``ShardedIndex``: one sharded version (``store.version.sharding``) opened as a ``SearchableIndex`` over its
shards, each an ordinary ``IndexVersion``.

Rows are global: shard offset + local row, the offsets being the cumulative ``total_rows`` of the shards
in order. A search asks every shard for its own top k (ANN with the shard's tuned parameters, or exact)
and merges them (``store.shards.merge.merge_topk``: score, then global row), so exact search over the shards
equals exact search over one index of the same rows. ``row_of`` asks only the owning shard (the hash rule;
every segment, newest first, for a segmented version); items and re-rank tokens are read from the shards
owning the rows asked for.

Product channels (``store.products.channels``) of a sharded version live once, beside the shards in the
version's
own folder, over the global rows (the shards hold the products' main rows, their first photos, as an
unsharded version does): ``products`` opens them as ``IndexVersion.products`` does, so the hybrid path
(``store.products.hybrid``) searches them with no per-shard merge. A sharded version without them (every one
written
before 27 Nov 2026) has ``products`` None and is searched as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from store.errors import IndexFormatError, IndexNotFoundError
from store.layout import FORMAT_VERSION, MANIFEST_FILE
from store.products.channels import ProductChannels, has_product_channels
from store.shards.merge import merge_topk
from store.version.manifest import IndexManifest
from store.version.metadata import filter_sql
from store.version.reader import IndexVersion, check_queries
from store.version.sharding import Sharding, locate, split_allowed

Results = tuple[np.ndarray, np.ndarray]


def load_shard_manifest(version_dir: Path, sharding: Sharding, index: int) -> tuple[IndexManifest, str]:
    """Shard ``index``'s manifest and the sha256 of its bytes (IndexFormatError when missing or not an
    ordinary format-1 manifest)."""
    path = Path(version_dir) / sharding.shards[index].dir / MANIFEST_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise IndexNotFoundError(f"shard manifest not found: {path}") from None
    try:
        manifest = IndexManifest.from_json(raw.decode("utf-8"))
    except (IndexFormatError, UnicodeDecodeError) as exc:
        raise IndexFormatError(f"{path}: {exc}") from None
    if manifest.is_sharded or manifest.format_version > FORMAT_VERSION:
        raise IndexFormatError(f"{path}: a shard must be an ordinary format-{FORMAT_VERSION} version")
    return manifest, hashlib.sha256(raw).hexdigest()


def global_live_mask(shards: Sequence[IndexVersion]) -> np.ndarray | None:
    """(total rows,) bool over the shards' global rows, False for deleted rows; None when none is."""
    masks = [(s.total_rows, s.live_mask()) for s in shards]
    if all(m is None for _, m in masks):
        return None
    return np.concatenate([np.ones(n, bool) if m is None else m for n, m in masks])


class ShardedIndex:
    """One opened, read-only sharded version (a ``SearchableIndex``). Thread-safe for concurrent searches,
    as its shards are."""

    manifest: IndexManifest
    path: Path

    def __init__(self, path: Path, manifest: IndexManifest) -> None:
        self.path = Path(path)
        self.manifest = manifest
        if not manifest.is_sharded:
            raise IndexFormatError(f"{self.path} is not a sharded version: open it as an IndexVersion")
        self.sharding = Sharding.from_dict(manifest.sharding)
        shards: list[IndexVersion] = []
        try:
            for i, entry in enumerate(self.sharding.shards):
                shard_manifest, digest = load_shard_manifest(self.path, self.sharding, i)
                where = self.path / entry.dir
                if digest != entry.manifest_sha256:
                    raise IndexFormatError(
                        f"{where / MANIFEST_FILE}: sha256 differs from the version's manifest"
                    )
                if (shard_manifest.embed_dim, shard_manifest.model_fingerprint) != (
                    manifest.embed_dim,
                    manifest.model_fingerprint,
                ):
                    raise IndexFormatError(f"{where}: another model or embedding dim than the version's")
                shard = IndexVersion(where, shard_manifest)
                shards.append(shard)
                if shard.total_rows != entry.total_rows:
                    raise IndexFormatError(
                        f"{where} holds {shard.total_rows} rows, the version's manifest says "
                        f"{entry.total_rows}"
                    )
            # The version's product channels, over its global rows (None: written without them).
            total = sum(s.total_rows for s in shards)
            self.products: ProductChannels | None = (
                ProductChannels(self.path, total) if has_product_channels(self.path) else None
            )
        except BaseException:
            for shard in shards:
                shard.close()
            raise
        self._shards = tuple(shards)
        self._offsets = self.sharding.offsets()
        self._totals = np.array([s.total_rows for s in shards], dtype=np.int64)
        self._fields = set().union(*(s.fields for s in shards))
        # Made here, before any search can ask for it (so no lock): see ``live_mask``.
        self._live = global_live_mask(shards)

    # -- the shards ------------------------------------------------------------------------------------------

    @property
    def shards(self) -> tuple[IndexVersion, ...]:
        return self._shards

    @property
    def offsets(self) -> tuple[int, ...]:
        """Each shard's global row offset."""
        return tuple(int(o) for o in self._offsets)

    @property
    def version(self) -> str:
        return self.manifest.version

    def __len__(self) -> int:
        return sum(len(s) for s in self._shards)

    @property
    def total_rows(self) -> int:
        return int(self._totals.sum())

    @property
    def fields(self) -> set[str]:
        return set(self._fields)

    def close(self) -> None:
        for shard in self._shards:
            shard.close()
        if self.products is not None:
            self.products.close()

    def damage(self) -> str | None:
        """What is wrong with the files of any shard or of the channels since the open (``store.guard``),
        None when nothing."""
        for shard in self._shards:
            problem = shard.damage()
            if problem is not None:
                return problem
        return None if self.products is None else self.products.damage()

    def __enter__(self) -> ShardedIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- search ------------------------------------------------------------------------------------------

    def _fan_out(
        self,
        queries: np.ndarray,
        k: int,
        allowed_rows: np.ndarray | None,
        search: Callable[[IndexVersion, np.ndarray, int, np.ndarray | None], Results],
    ) -> Results:
        q = check_queries(queries, k, self.manifest.embed_dim)
        scores: list[np.ndarray] = []
        rows: list[np.ndarray] = []
        parts = split_allowed(allowed_rows, self._offsets, self._totals)
        for shard, local in zip(self._shards, parts, strict=True):
            if len(shard) == 0 or (local is not None and local.size == 0):
                s, r = np.zeros((q.shape[0], 0), np.float32), np.zeros((q.shape[0], 0), np.int64)
            else:
                s, r = search(shard, q, k, local)
            scores.append(s)
            rows.append(r)
        return merge_topk(scores, rows, self._offsets, k)

    def search(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None) -> Results:
        """Every shard's ANN search (its tuned parameters), merged: (Q, k) scores and global rows, padded
        with -inf / -1."""
        return self._fan_out(queries, k, allowed_rows, lambda s, q, k, a: s.search(q, k, a))

    def search_exact(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None) -> Results:
        """Exact search over every shard, merged: equal to exact search over one index of the same rows."""
        return self._fan_out(queries, k, allowed_rows, lambda s, q, k, a: s.search_exact(q, k, a))

    def filter_rows(self, filters: dict[str, Any]) -> np.ndarray:
        """Sorted live global rows matching every filter (see ``IndexVersion.filter_rows``). A field no item
        of a shard carries matches nothing there."""
        filter_sql(filters, self._fields)  # unknown fields and malformed conditions raise FilterError here
        parts = [
            shard.filter_rows(filters) + offset
            for shard, offset in zip(self._shards, self._offsets, strict=True)
            if set(filters) <= shard.fields
        ]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def field_kinds(self, name: str) -> set[str]:
        """The kinds of value field ``name`` holds in any shard's live rows."""
        return set().union(*(shard.field_kinds(name) for shard in self._shards))

    def live_mask(self) -> np.ndarray | None:
        """(total_rows,) bool over the global rows, False for deleted rows; None when no row is deleted.
        Made once, when the version is opened (the product channels' searches and the live overlay read
        it; the shards' own searches mask their own rows)."""
        return self._live

    # -- rows: items, embeddings, re-rank tokens ------------------------------------------------------------

    def locate(self, rows: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard, local row) of global rows; IndexFormatError for an unknown row."""
        return locate(np.asarray(rows, dtype=np.int64), self._offsets, self._totals)

    def _gather(
        self, rows: Sequence[int] | np.ndarray, read: Callable[[IndexVersion, np.ndarray], Any]
    ) -> list:
        """``read(shard, local rows)`` per owning shard, as one list in the order of ``rows``."""
        shard_of_row, local = self.locate(rows)
        out: list[Any] = [None] * len(local)
        for i in np.unique(shard_of_row):
            pos = np.flatnonzero(shard_of_row == i)
            for p, value in zip(pos, read(self._shards[int(i)], local[pos]), strict=True):
                out[int(p)] = value
        return out

    def items(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        """{"id", "path", **fields} per global row, in the given order."""
        return self._gather([int(r) for r in rows], lambda shard, local: shard.items(local.tolist()))

    def row_of(self, item_id: str) -> int | None:
        """The live global row of ``item_id``, asked of its owning shard only."""
        owner = self.sharding.owner(item_id)
        for i in [owner] if owner is not None else range(len(self._shards) - 1, -1, -1):
            row = self._shards[i].row_of(item_id)
            if row is not None:
                return int(self._offsets[i]) + row
        return None

    def embeddings(self, rows: np.ndarray) -> np.ndarray:
        """(n, D) float32 stored embeddings of the given global rows."""
        found = self._gather(rows, lambda shard, local: shard.embeddings(local))
        return np.stack(found) if found else np.zeros((0, self.manifest.embed_dim), np.float32)

    def rerank_tokens(self, rows: np.ndarray) -> np.ndarray:
        """(n, T, W) float32 patch tokens of the given global rows."""
        rows = np.asarray(rows, dtype=np.int64).ravel()
        if rows.size == 0:
            return self._shards[0].rerank_tokens(rows)
        return np.stack(self._gather(rows, lambda shard, local: shard.rerank_tokens(local)))
