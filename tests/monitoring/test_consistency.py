"""The cross-language consistency report, hand-checked: ranks, variance, MRV, overlap and Kendall tau-b."""

from __future__ import annotations

import numpy as np
import pytest

from monitoring.consistency import consistency_report, kendall_tau_b


def test_hand_checked_report() -> None:
    # top_k 3; en: a b c, de: b a d, fr: a b c. Missing items count as rank 3.
    report = consistency_report({"en": ["a", "b", "c"], "de": ["b", "a", "d"], "fr": ["a", "b", "c"]}, 3)
    ranks = {item["id"]: item["ranks"] for item in report["items"]}
    assert ranks == {
        "a": {"en": 0, "de": 1, "fr": 0},
        "b": {"en": 1, "de": 0, "fr": 1},
        "c": {"en": 2, "de": 3, "fr": 2},
        "d": {"en": 3, "de": 2, "fr": 3},
    }
    # Each item: two equal ranks and one off by 1 -> variance ((1/3)^2*2 + (2/3)^2)/3 = 2/9, std sqrt(2)/3.
    assert [item["variance"] for item in report["items"]] == pytest.approx([2 / 9] * 4)
    assert report["mrv"] == pytest.approx(2 / 9)
    assert report["mrv_std"] == pytest.approx(np.sqrt(2) / 3)
    pairs = {(p["a"], p["b"]): p for p in report["pairs"]}
    # en-de: {a,b,c} vs {b,a,d} share 2 of 3; over a,b,c,d the pairs (a,b) and (c,d) disagree, 4 agree:
    # tau = (4 - 2) / 6.
    assert pairs["en", "de"]["overlap"] == pytest.approx(2 / 3)
    assert pairs["en", "de"]["kendall_tau"] == pytest.approx(1 / 3)
    assert pairs["en", "fr"]["overlap"] == 1.0 and pairs["en", "fr"]["kendall_tau"] == pytest.approx(1.0)
    assert report["mean_overlap"] == pytest.approx((2 / 3 + 1.0 + 2 / 3) / 3)


def test_kendall_tau_b_with_ties() -> None:
    # x has a tie (3, 3): 5 of 6 pairs untied in x, all 6 in y; concordant 4, discordant 1 -> 3/sqrt(30).
    x = np.array([0, 1, 3, 3])
    y = np.array([0, 2, 1, 3])
    assert kendall_tau_b(x, y) == pytest.approx(3 / np.sqrt(5 * 6))
    assert kendall_tau_b(np.array([1, 1]), np.array([0, 1])) is None
