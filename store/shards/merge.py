"""Merging per-shard top-k lists into the top k of the whole version: a pure function of arrays, used by
``store.shards.sharded.ShardedIndex`` and by anything that fans a query out to shards served apart (an ingress
collecting each shard's answer).

Order: score descending, then global row ascending, padding (-1 / -inf) last: the order exact search over
one index gives (``store.version.exact``), so merged exact search over S shards equals exact search over one
index
holding the same rows, ties included.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from store.version.exact import tie_key


def merge_topk(
    per_shard_scores: Sequence[np.ndarray],
    per_shard_rows: Sequence[np.ndarray],
    offsets: Sequence[int] | np.ndarray,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` of every shard's (Q, k_i) results for each of Q queries.

    Args:
        per_shard_scores: one (Q, k_i) float array per shard (k_i may differ, and be 0).
        per_shard_rows: the shard-local rows of those scores, -1 for padding.
        offsets: each shard's global row offset (cumulative ``total_rows`` of the shards before it).
        k: results wanted per query.

    Returns:
        (Q, k) float32 scores and int64 global rows, padded with -inf / -1 when fewer exist.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not len(per_shard_scores) == len(per_shard_rows) == len(offsets) or not per_shard_scores:
        raise ValueError(
            f"need one scores, rows and offset per shard, got {len(per_shard_scores)}, "
            f"{len(per_shard_rows)}, {len(offsets)}"
        )
    n_queries = np.asarray(per_shard_scores[0]).shape[0]
    all_s: list[np.ndarray] = [np.full((n_queries, k), -np.inf, dtype=np.float32)]
    all_r: list[np.ndarray] = [np.full((n_queries, k), -1, dtype=np.int64)]
    for scores, rows, offset in zip(per_shard_scores, per_shard_rows, offsets, strict=True):
        s = np.asarray(scores, dtype=np.float32)
        r = np.asarray(rows, dtype=np.int64)
        if s.ndim != 2 or s.shape != r.shape or s.shape[0] != n_queries:
            raise ValueError(f"shard results must be (Q={n_queries}, k_i) pairs, got {s.shape} and {r.shape}")
        real = r >= 0
        all_s.append(np.where(real, s, -np.inf).astype(np.float32))
        all_r.append(np.where(real, r + int(offset), -1))
    merged_s = np.concatenate(all_s, axis=1)
    merged_r = np.concatenate(all_r, axis=1)
    order = np.lexsort((tie_key(merged_r), -merged_s), axis=-1)[:, :k]
    out_s = np.take_along_axis(merged_s, order, 1)
    out_r = np.take_along_axis(merged_r, order, 1)
    out_r[~np.isfinite(out_s)] = -1
    return out_s, out_r
