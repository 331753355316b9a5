"""store.products.vectors helpers against plain-Python references."""

from __future__ import annotations

import numpy as np

from store.products.vectors import best_per_owner, positions_of


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


def test_best_of_equals_a_per_product_loop_with_masks_and_empty_products() -> None:
    """``GroupedVectors.best_of`` (segment maxima, no sort) against a plain loop: the best score of each
    product and the first row reaching it; -inf / -1 for a product without (unmasked) rows."""
    from store.products.vectors import GroupedVectors

    rng = np.random.default_rng(1)
    counts = rng.integers(0, 4, 60)  # some products have no row
    owners = np.repeat(np.arange(60), counts).astype(np.int64)
    vectors = rng.normal(size=(owners.size, 8)).astype(np.float32)
    vectors[5] = vectors[4]  # a tie inside a product: the first row wins
    grouped = GroupedVectors(vectors, owners, None, 60)
    for trial in range(20):
        query = rng.normal(size=8).astype(np.float32)
        products = rng.permutation(60)[:25].astype(np.int64)
        mask = None if trial % 2 else rng.random(owners.size) < 0.6
        scores, via = grouped.best_of(query, products, mask)
        for i, p in enumerate(products.tolist()):
            rows = [r for r in np.flatnonzero(owners == p).tolist() if mask is None or mask[r]]
            if not rows:
                assert scores[i] == -np.inf and via[i] == -1
                continue
            sims = [float(vectors[r] @ query) for r in rows]
            assert via[i] == rows[int(np.argmax(sims))]
            assert abs(scores[i] - max(sims)) < 1e-5


def test_best_per_owner_of_ranked_hits_equals_the_general_path_with_ties() -> None:
    """Hits that come best first (a walk's, BM25's) take the no-sort path: the same owners, scores, rows
    and tie order as the general path, ties inside an owner and between owners included."""
    rng = np.random.default_rng(3)
    for size in (1, 5, 60, 400):
        owners = rng.integers(0, max(1, size // 3), size).astype(np.int64)
        scores = np.round(rng.random(size), 1).astype(np.float32)  # many ties
        order = np.argsort(-scores, kind="stable")
        owners, scores = owners[order], scores[order]
        via = rng.permutation(size).astype(np.int64)
        general = best_per_owner(owners, scores, via)
        ranked = best_per_owner(owners, scores, via, ranked=True)
        assert ranked.owners.tolist() == general.owners.tolist()
        assert ranked.via.tolist() == general.via.tolist()
        np.testing.assert_array_equal(ranked.scores, general.scores)


def test_the_in_memory_view_of_a_graphs_vectors_keeps_its_index_alive() -> None:
    import gc

    import faiss

    from store.products.vectors import _in_memory_copy

    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(50, 8)).astype(np.float32)
    index = faiss.IndexHNSWFlat(8, 8, faiss.METRIC_INNER_PRODUCT)
    index.add(vectors)
    view = _in_memory_copy(index, vectors.copy())
    assert view is not vectors and not view.flags.writeable
    del index
    gc.collect()
    np.testing.assert_array_equal(np.asarray(view[10:20]), vectors[10:20])  # storage still there
    np.testing.assert_array_equal(np.asarray(view[[3, 7]]), vectors[[3, 7]])
