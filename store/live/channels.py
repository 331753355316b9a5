"""A served version's product channels with its upserted products after them (``store.live.delta``): what
hybrid search, labels, explain and similar items read, as they read a version's own
(``store.products.channels.ProductChannels``).

Each grouped vector set is the version's (searched through its ANN index) followed by the delta's
(searched exactly: a few thousand rows cost less than a walk), merged by score; a product's features
(``best_of``, the centroid) come from whichever part holds it. The lexical channel is the version's BM25
(tantivy) with the delta's values scored by the same formula (BM25, k1 1.2, b 0.75) over the version's
document frequencies and mean length (``term_idf``, which coverage weighs terms by, is the version's too),
so a new product's scores sit on the scale of the version's own in the same query, the scale its
calibrated fusion was fitted to. Text rows and photo rows of the delta follow the version's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from store.live.delta import Delta
from store.products.channels import ProductChannels, ProductInfo
from store.products.vectors import ChannelHits, GroupedVectors, best_per_owner
from store.text.lexical import fold_diacritics

BM25_K1, BM25_B = 1.2, 0.75


def merged_hits(a: ChannelHits, b: ChannelHits, n: int) -> ChannelHits:
    """The ``n`` best of two channels' hits over disjoint products, best first (ties: ``a`` first)."""
    if not b.owners.size:
        return a
    if not a.owners.size:
        return ChannelHits(b.owners[:n], b.scores[:n], b.via[:n])
    owners = np.concatenate([a.owners, b.owners])
    scores = np.concatenate([a.scores, b.scores]).astype(np.float32)
    via = np.concatenate([a.via, b.via])
    order = np.argsort(-scores, kind="stable")[:n]
    return ChannelHits(owners[order], scores[order], via[order])


class _JoinedRows:
    """The version's rows then the delta's, indexed by one row number (an int or an array of them)."""

    def __init__(self, base: np.ndarray, more: np.ndarray) -> None:
        self.base, self.more = base, more
        self.shape = (len(base) + len(more), *base.shape[1:])

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: Any) -> np.ndarray:
        if np.isscalar(rows):
            row = int(rows)  # type: ignore[arg-type]
            return self.base[row] if row < len(self.base) else self.more[row - len(self.base)]
        rows = np.asarray(rows, np.int64)
        out = np.empty((rows.size, *self.shape[1:]), np.float32)
        low = rows < len(self.base)
        out[low] = self.base[rows[low]]
        out[~low] = self.more[rows[~low] - len(self.base)]
        return out


class LiveVectors:
    """A version's grouped vector set followed by the delta's (``GroupedVectors``' interface)."""

    def __init__(self, base: GroupedVectors, more: GroupedVectors, base_products: int, products: int) -> None:
        self.base, self.more = base, more
        self.base_rows = len(base)
        self.base_products = base_products
        self._products = products  # the row space: the version's rows and every delta row allotted
        self.vectors = _JoinedRows(base.vectors, more.vectors)
        self.index = base.index
        self._start: np.ndarray | None = None
        self._owners: np.ndarray | None = None

    def __len__(self) -> int:
        return self.base_rows + len(self.more)

    @property
    def products(self) -> int:
        return self._products

    @property
    def walks_a_graph(self) -> bool:
        return self.base.walks_a_graph

    def set_walk_width(self, ef: int) -> None:
        self.base.set_walk_width(ef)

    @property
    def start(self) -> np.ndarray:
        """Product p's rows are ``start[p]:start[p + 1]`` over the joined rows (built when first read)."""
        if self._start is None:
            tail = self.more.start + self.base_rows
            pad = np.full(self._products - self.base_products - self.more.products, tail[-1], np.int64)
            self._start = np.concatenate([self.base.start[: self.base_products], tail, pad])
        return self._start

    @property
    def owners(self) -> np.ndarray:
        if self._owners is None:
            self._owners = np.concatenate([self.base.owners, self.more.owners + self.base_products])
        return self._owners

    def _split(self, products: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        products = np.asarray(products, np.int64)
        low = products < self.base_products
        return low, products

    def best_of(
        self, query: np.ndarray, products: np.ndarray, row_mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
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
        low, products = self._split(products)
        scores = np.full(products.size, -np.inf, np.float32)
        centroids = np.full(products.size, -np.inf, np.float32)
        via = np.full(products.size, -1, np.int64)
        base_mask = None if row_mask is None else row_mask[: self.base_rows]
        more_mask = None if row_mask is None else row_mask[self.base_rows :]
        if low.any():
            norms = None if sum_norms is None else sum_norms[: self.base_products]
            s, v, c = self.base.best_and_centroid_of(
                query, products[low], base_mask, norms, centroid=centroid
            )
            scores[low], via[low], centroids[low] = s, v, c
        local = products[~low] - self.base_products
        held = local < self.more.products  # rows of the block not written yet hold nothing
        if held.any():
            at = np.flatnonzero(~low)[held]
            norms = None if sum_norms is None else sum_norms[self.base_products :]
            s, v, c = self.more.best_and_centroid_of(query, local[held], more_mask, norms, centroid=centroid)
            scores[at], centroids[at] = s, c
            via[at] = np.where(v >= 0, v + self.base_rows, -1)
        return scores, via, centroids

    def search(
        self, query: np.ndarray, n: int, allowed: np.ndarray | None, row_mask: np.ndarray | None = None
    ) -> ChannelHits:
        base_allowed = None if allowed is None else allowed[: self.base_products]
        base_mask = None if row_mask is None else row_mask[: self.base_rows]
        found = self.base.search(query, n, base_allowed, base_mask)
        if not len(self.more) or n < 1:
            return found
        more_allowed = None if allowed is None else allowed[self.base_products :][: self.more.products]
        more_mask = None if row_mask is None else row_mask[self.base_rows :]
        extra = self.more.search(query, n, more_allowed, more_mask)
        extra = ChannelHits(extra.owners + self.base_products, extra.scores, extra.via + self.base_rows)
        return merged_hits(found, extra, n)


class LiveChannels:
    """``ProductChannels`` of a version with a delta after its rows (read-only; a new one per snapshot). Every
    attribute it does not define is the version's own."""

    def __init__(self, base: ProductChannels, delta: Delta, products: int) -> None:
        self.base = base
        self.delta = delta
        self.info: ProductInfo = dataclasses.replace(
            base.info,
            photos=base.info.photos + len(delta.photos),
            texts=base.info.texts + len(delta.texts),
        )
        rows = base.photos.products
        self.photos = LiveVectors(base.photos, delta.photos, rows, products)
        self.texts = LiveVectors(base.texts, delta.texts, rows, products)
        self.visual = None
        if base.visual is not None:
            more = delta.visual if delta.visual is not None else delta.photos
            self.visual = LiveVectors(base.visual, more, rows, products)
        self.text_sum_norms = None
        if base.text_sum_norms is not None:
            pad = np.zeros(products - rows - delta.count, np.float32)
            self.text_sum_norms = np.concatenate([base.text_sum_norms, delta.text_sum_norms, pad])
        self._base_texts = len(base.texts)
        self._base_photos = len(base.photos)

    def __getattr__(self, name: str) -> Any:
        if name in ("base", "delta"):
            raise AttributeError(name)
        return getattr(self.base, name)

    @property
    def visual_vectors(self) -> LiveVectors:
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
        rows = self.base.photos.products
        base_allowed = None if allowed is None else allowed[:rows]
        base_mask = None if row_mask is None else row_mask[: self._base_texts]
        found = self.base.lexical(terms, n, base_allowed, base_mask, weights)
        if not terms or n < 1 or not len(self.delta.texts):
            return found
        return merged_hits(found, self._delta_bm25(terms, n, allowed, row_mask, weights), n)

    def _delta_bm25(
        self,
        terms: Sequence[str],
        n: int,
        allowed: np.ndarray | None,
        row_mask: np.ndarray | None,
        weights: Mapping[str, float] | None,
    ) -> ChannelHits:
        """BM25 of the delta's text values, as tantivy scores the version's (its term folding, its boosts)."""
        delta, count = self.delta, len(self.delta.texts)
        factor: dict[str, float] = {}
        for t in terms:
            f = fold_diacritics(t)
            factor[f] = max(factor.get(f, 0.0), 1.0 if weights is None else float(weights.get(t, 1.0)))
        idf = self._folded_idf(list(factor))
        mean_length = max(1.0, self.base_mean_terms())
        scores = np.zeros(count, np.float64)
        lengths = delta.text_lengths[:count].astype(np.float64)
        norm = BM25_K1 * (1 - BM25_B + BM25_B * lengths / mean_length)
        for term, boost in factor.items():
            for row, tf in delta.postings.get(term, ()):
                if row < count:
                    scores[row] += boost * idf[term] * tf * (BM25_K1 + 1) / (tf + norm[row])
        rows = np.flatnonzero(scores > 0)
        if not rows.size:
            return ChannelHits.empty()
        owners = delta.texts.owners[rows]
        keep = np.ones(rows.size, bool)
        if allowed is not None:
            keep &= allowed[owners + self.base.photos.products]
        if row_mask is not None:
            keep &= row_mask[rows + self._base_texts]
        rows, owners = rows[keep], owners[keep]
        hits = best_per_owner(owners, scores[rows].astype(np.float32), rows)
        return ChannelHits(
            hits.owners[:n] + self.base.photos.products, hits.scores[:n], hits.via[:n] + self._base_texts
        )

    def _folded_idf(self, folded: Sequence[str]) -> dict[str, float]:
        """BM25's idf of folded terms over the version's values: the statistics tantivy scores the version's
        own values by in the same query, so old and new values share one scale."""
        docs = self.base.doc_freqs(folded)
        total = max(1, self.base.info.texts)
        return {
            t: float(np.log(1.0 + (total - docs.get(t, 0) + 0.5) / (docs.get(t, 0) + 0.5))) for t in folded
        }

    def base_mean_terms(self) -> float:
        return self.base.mean_terms()

    # -- rows ------------------------------------------------------------------------------------------------

    def _split_texts(self, text_rows: Sequence[int]) -> tuple[list[int], list[int]]:
        rows = [int(r) for r in text_rows if r >= 0]
        return [r for r in rows if r < self._base_texts], [r for r in rows if r >= self._base_texts]

    def presence(self, text_rows: np.ndarray, terms: Sequence[str]) -> np.ndarray:
        rows = np.asarray(text_rows, np.int64)
        low = rows < self._base_texts
        present = np.zeros((rows.size, len(terms)), bool)
        if low.any():
            present[low] = self.base.presence(rows[low], terms)
        for i in np.flatnonzero(~low).tolist():
            held = set(self.delta.text_values[int(rows[i]) - self._base_texts].terms)
            present[i] = [t in held for t in terms]
        return present

    def terms_of(self, text_rows: Sequence[int]) -> dict[int, list[str]]:
        low, high = self._split_texts(text_rows)
        out = self.base.terms_of(low)
        out.update({r: list(self.delta.text_values[r - self._base_texts].terms) for r in high})
        return out

    def texts_of(self, text_rows: Sequence[int]) -> dict[int, tuple[str, str | None, str]]:
        low, high = self._split_texts(text_rows)
        out = self.base.texts_of(low)
        for r in high:
            value = self.delta.text_values[r - self._base_texts]
            out[r] = (value.field, value.lang, value.text)
        return out

    def photo_paths(self, products: Sequence[int]) -> dict[int, list[str]]:
        rows = self.base.photos.products
        wanted = [int(p) for p in products]
        out = self.base.photo_paths([p for p in wanted if p < rows])
        delta = self.delta
        for p in wanted:
            if p >= rows:
                local = p - rows
                if local < delta.count:
                    lo, hi = int(delta.photos.start[local]), int(delta.photos.start[local + 1])
                    out[p] = list(delta.photo_paths[lo:hi])
                else:
                    out[p] = []
        return out

    def photo_index_of(self, photo_row: int) -> int:
        if photo_row < self._base_photos:
            return self.base.photo_index_of(photo_row)
        local = photo_row - self._base_photos
        owner = int(self.delta.photos.owners[local])
        return int(local - self.delta.photos.start[owner])
