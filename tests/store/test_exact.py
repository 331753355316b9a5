"""Exact search's running top-k: the partial selection equals a full sort, ties and padding included."""

from __future__ import annotations

import numpy as np

from store.version.exact import topk_merge


def test_topk_merge_equals_a_full_sort_with_ties_and_padding() -> None:
    """The partial selection must give exactly what sorting every candidate gives (ties by lower row)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        q, m, k = int(rng.integers(1, 5)), int(rng.integers(1, 300)), int(rng.integers(1, 40))
        scores = np.round(rng.normal(size=(q, m)), 1).astype(np.float32)  # one decimal: many ties
        rows = np.repeat(rng.permutation(1000)[:m][None], q, axis=0).astype(np.int64)
        rows[:, : m // 5], scores[:, : m // 5] = -1, -np.inf  # padding, as faiss returns it
        best_s, best_r = np.full((q, k), -np.inf, np.float32), np.full((q, k), -1, np.int64)
        all_s, all_r = np.concatenate([best_s, scores], 1), np.concatenate([best_r, rows], 1)
        order = np.lexsort((np.where(all_r < 0, np.iinfo(np.int64).max, all_r), -all_s), axis=-1)[:, :k]
        got_s, got_r = topk_merge(best_s, best_r, scores, rows, k)
        assert np.array_equal(got_s, np.take_along_axis(all_s, order, 1))
        assert np.array_equal(got_r, np.take_along_axis(all_r, order, 1))
