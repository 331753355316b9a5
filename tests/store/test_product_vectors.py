"""store.product_vectors helpers against plain-Python references."""

from __future__ import annotations

import numpy as np

from store.product_vectors import best_per_owner, positions_of


def test_positions_of_matches_a_dict_lookup() -> None:
    rng = np.random.default_rng(0)
    for size in (0, 1, 7, 200):
        keys = rng.permutation(1000)[:size].astype(np.int64)
        values = rng.integers(0, 1000, 300).astype(np.int64)
        lookup = {int(k): i for i, k in enumerate(keys.tolist())}
        expected = [lookup.get(int(v), -1) for v in values.tolist()]
        assert positions_of(values, keys).tolist() == expected


def test_best_per_owner_keeps_each_owners_best_row_best_first() -> None:
    owners = np.array([3, 1, 3, 2, 1], np.int64)
    scores = np.array([0.1, 0.5, 0.9, 0.2, 0.7], np.float32)
    hits = best_per_owner(owners, scores, np.arange(5, dtype=np.int64))
    assert hits.owners.tolist() == [3, 1, 2]
    assert hits.via.tolist() == [2, 4, 3]
    assert np.allclose(hits.scores, [0.9, 0.7, 0.2])
