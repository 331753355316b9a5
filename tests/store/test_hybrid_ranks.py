"""Channel ranks in store.products.hybrid: equal scores share a rank, so reciprocal-rank fusion does not tell
tied
products apart by their row numbers (which a sharded version numbers otherwise)."""

from __future__ import annotations

import numpy as np

from store.products.hybrid import _ranks, _tied_ranks
from store.products.vectors import ChannelHits


def _hits(owners: list[int], scores: list[float]) -> ChannelHits:
    return ChannelHits(
        np.asarray(owners, np.int64), np.asarray(scores, np.float32), np.zeros(len(owners), np.int64)
    )


def test_tied_scores_share_the_rank_of_the_first_of_them() -> None:
    hits = _hits([7, 3, 5, 9], [0.9, 0.8, 0.8, 0.5])
    rows = np.asarray([3, 4, 5, 7, 9], np.int64)
    assert _ranks(rows, hits).tolist() == [1, -1, 2, 0, 3]  # positions: the index into the hits
    assert _tied_ranks(_ranks(rows, hits), hits.scores).tolist() == [1, -1, 1, 0, 3]


def test_the_ranks_do_not_depend_on_how_tied_hits_are_ordered() -> None:
    rows = np.asarray([3, 5, 7], np.int64)
    one = _hits([7, 3, 5], [0.9, 0.8, 0.8])
    other = _hits([7, 5, 3], [0.9, 0.8, 0.8])  # the same products, the tie in another order
    assert (
        _tied_ranks(_ranks(rows, one), one.scores).tolist()
        == _tied_ranks(_ranks(rows, other), other.scores).tolist()
    )
    assert _ranks(rows, one).tolist() != _ranks(rows, other).tolist()


def test_the_labels_depth_check_reads_positions_not_tied_ranks() -> None:
    """A lexical hit at position 55 tied with position 45's score: a deeper page gathers it, but the label
    (calibrated on each channel's first CANDIDATES) must not read it."""
    from store.products.hybrid import CANDIDATES, Candidates, GroupParams, query_match_score

    none = np.full(2, -1, np.int64)
    positions = np.asarray([[-1, -1, CANDIDATES + 5], [0, -1, -1]], np.int64)
    # the lexical hits from position CANDIDATES - 5 on share one score
    lexical = np.concatenate([np.linspace(1.0, 0.5, CANDIDATES - 5), np.full(11, 0.4)]).astype(np.float32)
    scores = (np.asarray([0.9], np.float32), np.zeros(0, np.float32), lexical)
    cands = Candidates(
        np.arange(2, dtype=np.int64),
        np.zeros((2, 5), np.float32),
        positions,
        none,
        none,
        none,
        channel_scores=scores,
    )
    assert cands.tied_ranks().tolist() == [[-1, -1, CANDIDATES - 5], [0, -1, -1]]
    params = GroupParams(weights=[], match=[1.0, 1.0, 1.0, 0.0], match_over="any")
    quality = np.asarray([0.9, 0.3])
    assert query_match_score(cands, quality, np.asarray([0, 1]), params) == 0.3
