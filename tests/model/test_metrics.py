"""Metrics on hand-worked rank tables."""

import numpy as np
import pytest

from model.metrics import mean_recall, mrv, mrv_std, ranks_from_scores, recall_at_k

# 3 instances x 2 languages, 0-based ranks.
RANKS = np.array([[0, 2], [1, 1], [4, 0]])


def test_recall_per_language() -> None:
    assert recall_at_k(RANKS, 1).tolist() == [1 / 3, 1 / 3]
    assert recall_at_k(RANKS, 2).tolist() == [2 / 3, 2 / 3]
    assert recall_at_k(RANKS, 5).tolist() == [1.0, 1.0]


def test_mean_recall() -> None:
    # R@1 = 1/3, R@5 = 1, R@10 = 1 in both languages.
    assert mean_recall(RANKS) == pytest.approx((1 / 3 + 1 + 1) / 3)


def test_mrv_is_eq7() -> None:
    # Instance means 1, 1, 2; squared deviations (1, 1), (0, 0), (4, 4): total 10 over 6 entries.
    assert mrv(RANKS) == pytest.approx(10 / 6)


def test_mrv_std_is_authors_code() -> None:
    # Population std per instance: 1, 0, 2 -> mean 1.
    assert mrv_std(RANKS) == pytest.approx(1.0)
    assert mrv_std(RANKS) <= np.sqrt(mrv(RANKS))


def test_consistent_ranks_have_zero_mrv() -> None:
    table = np.array([[3, 3, 3], [7, 7, 7]])
    assert mrv(table) == 0.0 and mrv_std(table) == 0.0


def test_bad_tables_are_rejected() -> None:
    with pytest.raises(ValueError, match="N, K"):
        mrv(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="0-based"):
        recall_at_k(np.array([[-1, 0]]), 1)
    with pytest.raises(ValueError, match="k must be"):
        recall_at_k(RANKS, 0)


def test_ranks_from_scores_single_and_multiple_targets() -> None:
    scores = np.array([[0.1, 0.9, 0.5], [0.7, 0.2, 0.7]])
    assert ranks_from_scores(scores, np.array([2, 0])).tolist() == [1, 1]  # the tie counts against
    # Several correct columns: the best one counts, the other targets are not "above".
    assert ranks_from_scores(scores, np.array([[0, 2], [1, -1]])).tolist() == [1, 2]
