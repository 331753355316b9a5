"""Searching one grouped vector set of a version's product channels (``store.products.channels``): every
photo of
every product, their visual embeddings, or every text value, each row owned by a product row. A channel
answers with each product's best row (``ChannelHits``); candidates another channel found get their exact
best score here too (``GroupedVectors.best_of``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np


@dataclass
class ChannelHits:
    """One channel's best match per product: product rows, their scores, and which photo or text row made
    each score (for "the image that matched" and explanations)."""

    owners: np.ndarray  # (n,) int64 product rows, best first
    scores: np.ndarray  # (n,) float32
    via: np.ndarray  # (n,) int64 photo or text rows

    @staticmethod
    def empty() -> ChannelHits:
        return ChannelHits(np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int64))


def best_per_owner(
    owners: np.ndarray, scores: np.ndarray, via: np.ndarray, *, ranked: bool = False
) -> ChannelHits:
    """Keep each owner's best; best first (ties: lower owner first). ``ranked``: the scores come best first
    already (a graph walk's or BM25's hits), so each owner's first row is its best: no sort by score."""
    if owners.size == 0:
        return ChannelHits.empty()
    if ranked:
        owners, first = np.unique(owners, return_index=True)  # by owner, each at its first (best) row
        scores, via = scores[first], via[first]
    else:
        order = np.lexsort((-scores, owners))  # by owner, best first within each
        owners, scores, via = owners[order], scores[order], via[order]
        first = np.ones(owners.size, bool)
        first[1:] = owners[1:] != owners[:-1]
        owners, scores, via = owners[first], scores[first], via[first]
    best = np.argsort(-scores, kind="stable")
    return ChannelHits(owners[best], scores[best].astype(np.float32), via[best])


def concat_ranges(lo: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the ranges ``lo[i] : lo[i] + counts[i]`` one after another, and where each range
    starts among them (the segments ``np.*.reduceat`` reads)."""
    firsts = np.cumsum(counts) - counts
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) + np.repeat(lo - firsts, counts), firsts


def positions_of(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Each value's index in ``keys`` (unique, any order), -1 where it is not there."""
    out = np.full(values.size, -1, np.int64)
    if keys.size == 0 or values.size == 0:
        return out
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    at = np.minimum(np.searchsorted(sorted_keys, values), sorted_keys.size - 1)
    found = sorted_keys[at] == values
    out[found] = order[at[found]]
    return out


def _in_memory_copy(index: Any | None, vectors: np.ndarray) -> np.ndarray:
    """The vectors as a graph index over full float32 vectors already holds them in memory (a view of its
    storage, no copy), else ``vectors`` (memory-mapped). The exact scores of candidates (``best_of``) read
    hundreds of scattered rows per query: from the mapped file each first touch of a page faults (measured
    at 25k products: 0.95 ms of a query's 5.7), from the graph's own copy none does, and the file's pages
    need not sit in memory a second time. Only versions written before 27 Nov 2026 have such graphs: those
    written since walk half precision (``store.products.channels._vector_index``) and read the mapped file."""
    if not isinstance(index, faiss.IndexHNSW):
        return vectors
    storage = faiss.downcast_index(index.storage)
    if (
        not isinstance(storage, faiss.IndexFlat)
        or storage.ntotal != len(vectors)
        or storage.d != vectors.shape[1]
    ):
        return vectors
    raw = faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * storage.d).reshape(storage.ntotal, storage.d)
    view = raw.view(_IndexView)
    view.index = index  # the storage lives as long as this view, and any view of it, holds its index
    view.flags.writeable = False
    return view


class _IndexView(np.ndarray):
    """An array over a faiss index's own storage, keeping the index alive (``rev_swig_ptr`` does not)."""

    index: Any = None

    def __array_finalize__(self, obj: Any) -> None:
        self.index = getattr(obj, "index", None)


def sum_norms(vectors: np.ndarray, owners: np.ndarray, products: int) -> np.ndarray:
    """(products,) float32: the norm of the sum of each product's rows (owners ascending; 0 for a product
    without rows), what ``GroupedVectors.best_and_centroid_of`` divides by."""
    out = np.zeros(products, np.float32)
    if owners.size == 0:
        return out
    start = np.searchsorted(owners, np.arange(products + 1), side="left")
    held = np.flatnonzero(start[1:] > start[:-1])
    for lo in range(0, held.size, 4096):  # in blocks: a (block, D) sum at a time, not all rows at once
        part = held[lo : lo + 4096]
        first, last = int(start[part[0]]), int(start[part[-1] + 1])
        out[part] = _norms_of_sums(np.asarray(vectors[first:last], np.float32), start[part] - first)
    return out


def _norms_of_sums(rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The norm of the sum of each segment of ``rows`` (segments begin at ``starts``, as ``reduceat``
    reads them): one computation for the stored norms and the masked ones, so both give the same bits."""
    sums = np.add.reduceat(rows, starts, axis=0)
    return np.sqrt(np.einsum("ij,ij->i", sums, sums, dtype=np.float32))


class GroupedVectors:
    """One grouped vector set (photos, their visual embeddings, or text values) with its ANN index."""

    def __init__(self, vectors: np.ndarray, owners: np.ndarray, index: Any | None, products: int) -> None:
        self.vectors = _in_memory_copy(index, vectors)
        # A graph over full float32 vectors scores exactly; one over half precision is rescored.
        self._walk_is_exact = self.vectors is not vectors
        self.owners = owners
        self.index = index
        # Product p's rows are start[p]:start[p + 1] (owners ascending).
        self.start = np.searchsorted(owners, np.arange(products + 1), side="left").astype(np.int64)

    def __len__(self) -> int:
        return int(self.owners.size)

    @property
    def products(self) -> int:
        return int(self.start.size - 1)

    @property
    def walks_a_graph(self) -> bool:
        """Searched through a graph index (else exactly, by a matrix product)."""
        return isinstance(self.index, faiss.IndexHNSW)

    def set_walk_width(self, ef: int) -> None:
        """The graph walk's efSearch (``indexer.channel_tuning`` chooses it at build time)."""
        if isinstance(self.index, faiss.IndexHNSW):
            self.index.hnsw.efSearch = int(ef)

    def best_of(
        self, query: np.ndarray, products: np.ndarray, row_mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Exact best score and row per given product (-inf / -1 for a product with no row): the features
        of candidates that another channel found."""
        scores, via, _ = self.best_and_centroid_of(query, products, row_mask, centroid=False)
        return scores, via

    def best_and_centroid_of(
        self,
        query: np.ndarray,
        products: np.ndarray,
        row_mask: np.ndarray | None = None,
        sum_norms: np.ndarray | None = None,
        *,
        centroid: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``best_of``, and each product's centroid cosine: the query against the normalised sum of its
        rows (-inf for a product with no row), from the same row scores (the sum of its rows' scores over
        the norm of their sum). ``sum_norms``: those norms per product (``sum_norms``), or None: computed
        here from the rows when ``row_mask`` leaves some out (calibration), else the centroid is -inf (a
        version written without them)."""
        # Each product's rows lie together, so each best is a segment maximum: no sort.
        lo = self.start[products]
        counts = self.start[products + 1] - lo
        scores = np.full(products.size, -np.inf, np.float32)
        centroids = np.full(products.size, -np.inf, np.float32)
        via = np.full(products.size, -1, np.int64)
        total = int(counts.sum())
        if total == 0:
            return scores, via, centroids
        rows, firsts = concat_ranges(lo, counts)
        vectors = np.asarray(self.vectors[rows], np.float32)
        sims = vectors @ query
        held = np.flatnonzero(counts > 0)
        starts = firsts[held]
        if centroid and (row_mask is not None or sum_norms is not None):
            kept = sims if row_mask is None else np.where(row_mask[rows], sims, np.float32(0.0))
            if row_mask is None:
                norms = np.asarray(sum_norms, np.float32)[products[held]]
            else:  # the centroid of the rows left in (slow: calibration only)
                norms = _norms_of_sums(vectors * row_mask[rows, None], starts)
            with np.errstate(divide="ignore", invalid="ignore"):
                centroids[held] = np.where(norms > 0, np.add.reduceat(kept, starts) / norms, -np.inf)
        if row_mask is not None:
            sims[~row_mask[rows]] = -np.inf
        best = np.maximum.reduceat(sims, starts)
        scores[held] = best
        # The first row reaching its product's best (as a stable sort would pick), none where all are masked.
        at = np.flatnonzero(sims == np.repeat(best, counts[held]))
        segment = np.repeat(np.arange(held.size), counts[held])[at]
        first = np.ones(at.size, bool)
        first[1:] = segment[1:] != segment[:-1]
        via[held[segment[first]]] = rows[at[first]]
        via[~np.isfinite(scores)] = -1
        return scores, via, centroids

    def _rescored(self, hits: ChannelHits, query: np.ndarray) -> ChannelHits:
        """Hits of a walk over half precision with their rows' exact scores, best first again (only the
        kept rows are read: a quarter of those walked)."""
        exact = np.asarray(self.vectors[hits.via], np.float32) @ query
        order = np.argsort(-exact, kind="stable")
        return ChannelHits(hits.owners[order], exact[order], hits.via[order])

    def search(
        self, query: np.ndarray, n: int, allowed: np.ndarray | None, row_mask: np.ndarray | None = None
    ) -> ChannelHits:
        """The ``n`` best products by their best row; ``allowed``: a boolean mask over product rows (live
        and matching the filters), ``row_mask``: over this set's rows (calibration leaves fields out)."""
        total = len(self)
        if total == 0 or n < 1 or (allowed is not None and not allowed.any()):
            return ChannelHits.empty()
        if self.index is None or isinstance(self.index, faiss.IndexFlat) or row_mask is not None:
            sims = np.asarray(self.vectors, np.float32) @ query
            keep = np.ones(total, bool) if allowed is None else allowed[self.owners]
            if row_mask is not None:
                keep &= row_mask
            rows = np.flatnonzero(keep)
            if rows.size > 4 * n:
                rows = rows[np.argpartition(-sims[rows], 4 * n)[: 4 * n]]
            hits = best_per_owner(self.owners[rows], sims[rows], rows)
            while len(hits.owners) < n and rows.size < keep.sum():  # many rows of few products
                rows = np.flatnonzero(keep)
                hits = best_per_owner(self.owners[rows], sims[rows], rows)
            return ChannelHits(hits.owners[:n], hits.scores[:n], hits.via[:n])
        fetch = min(total, max(4 * n, 64))
        while True:
            scores, rows = self.index.search(query[None, :].astype(np.float32), fetch)
            rows, scores = rows[0], scores[0]
            ok = rows >= 0
            rows, scores = rows[ok].astype(np.int64), scores[ok]
            if allowed is not None:
                keep = allowed[self.owners[rows]]
                rows, scores = rows[keep], scores[keep]
            hits = best_per_owner(self.owners[rows], scores, rows, ranked=True)
            if len(hits.owners) >= n or fetch >= total:
                hits = ChannelHits(hits.owners[:n], hits.scores[:n], hits.via[:n])
                return hits if self._walk_is_exact else self._rescored(hits, query)
            fetch = min(total, fetch * 4)
