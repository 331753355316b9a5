"""Channel ranks in store.hybrid: equal scores share a rank, so reciprocal-rank fusion does not tell tied
products apart by their row numbers (which a sharded version numbers otherwise)."""

from __future__ import annotations

import numpy as np

from store.hybrid import _ranks, _tied_ranks
from store.product_vectors import ChannelHits


def _hits(owners: list[int], scores: list[float]) -> ChannelHits:
    return ChannelHits(
        np.asarray(owners, np.int64), np.asarray(scores, np.float32), np.zeros(len(owners), np.int64)
    )


def test_tied_scores_share_the_rank_of_the_first_of_them() -> None:
    hits = _hits([7, 3, 5, 9], [0.9, 0.8, 0.8, 0.5])
    rows = np.asarray([3, 4, 5, 7, 9], np.int64)
    assert _ranks(rows, hits).tolist() == [1, -1, 2, 0, 3]  # positions: the index into the hits
    assert _tied_ranks(_ranks(rows, hits), hits).tolist() == [1, -1, 1, 0, 3]


def test_the_ranks_do_not_depend_on_how_tied_hits_are_ordered() -> None:
    rows = np.asarray([3, 5, 7], np.int64)
    one = _hits([7, 3, 5], [0.9, 0.8, 0.8])
    other = _hits([7, 5, 3], [0.9, 0.8, 0.8])  # the same products, the tie in another order
    assert _tied_ranks(_ranks(rows, one), one).tolist() == _tied_ranks(_ranks(rows, other), other).tolist()
    assert _ranks(rows, one).tolist() != _ranks(rows, other).tolist()
