"""Tuning the graph walks of a staged version's product channels (``store.products.channels``), as
``indexer.tuning`` tunes the main index: for each channel searched through a graph (photos, text values),
the cheapest efSearch whose product-level recall@``CANDIDATES`` against exact search reaches the target
recall on held-out queries. The result goes into ``products.json`` (``ProductInfo.search_params``) and the
service walks with it; versions written before read the fixed default
(``store.products.channels.HNSW_EF_SEARCH``).

Queries are a sample of the catalogue's own text values (what a shopper's text query resembles), else of
its photos' embeddings: product rows, exactly as the hybrid search asks them
(``store.products.hybrid.gather``)."""

from __future__ import annotations

import numpy as np

from indexer.ann import EF_GRID
from store.products.channels import PHOTO_INDEX, TEXT_INDEX, ProductChannels
from store.products.hybrid import CANDIDATES
from store.products.vectors import GroupedVectors

TUNE_QUERIES = 200


def exact_products(grouped: GroupedVectors, queries: np.ndarray, n: int = CANDIDATES) -> list[set[int]]:
    """The exact ``n`` best products of each query (the reference answer every walk width is held to)."""
    exact = GroupedVectors(grouped.vectors, grouped.owners, None, grouped.products)
    return [set(exact.search(q, n, None).owners.tolist()) for q in queries]


def channel_recall(
    grouped: GroupedVectors,
    queries: np.ndarray,
    n: int = CANDIDATES,
    truth: list[set[int]] | None = None,
) -> float:
    """Mean share of the exact ``n`` best products (``truth``: computed when not given) that the channel's
    graph walk returns."""
    if truth is None:
        truth = exact_products(grouped, queries, n)
    found = sum(
        len(t & set(grouped.search(q, n, None).owners.tolist())) for q, t in zip(queries, truth, strict=True)
    )
    wanted = sum(len(t) for t in truth)
    return found / wanted if wanted else 1.0


def tune_channels(channels: ProductChannels, target: float, seed: int = 0) -> dict[str, dict[str, float]]:
    """Set each graph channel's efSearch (the first of ``EF_GRID`` reaching ``target``, else the best
    tried) and return {index file: {"efSearch": ef, "recall": measured}} for ``ProductInfo.search_params``."""
    source = channels.texts if len(channels.texts) else channels.photos
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(source), size=min(len(source), TUNE_QUERIES), replace=False))
    queries = np.asarray(source.vectors[pick], np.float32)
    tuned: dict[str, dict[str, float]] = {}
    for name, grouped in ((PHOTO_INDEX, channels.photos), (TEXT_INDEX, channels.texts)):
        if not grouped.walks_a_graph or queries.size == 0:
            continue
        best = (float(EF_GRID[-1]), -1.0)
        truth = exact_products(grouped, queries)  # once per channel, not once per width tried
        for ef in EF_GRID:
            grouped.set_walk_width(ef)
            recall = channel_recall(grouped, queries, truth=truth)
            if recall > best[1]:
                best = (float(ef), recall)
            if recall >= target:
                break
        grouped.set_walk_width(int(best[0]))
        tuned[name] = {"efSearch": int(best[0]), "recall": round(best[1], 4)}
    return tuned
