"""The re-rank policy (``indexer.rerank_policy``): its per-query decision and its fitting against exact
references on tiny arrays, its setting, and the policy a build records in the manifest."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from ccrk_settings import Settings
from indexer.build import build
from indexer.rerank_policy import (
    DEPTHS,
    RerankPolicy,
    calibrate,
    depth_gaps,
    fit,
    fit_min_gap,
    measure,
    winner_ranks,
)
from store.version.reader import IndexVersion


def shortlist(top: float, second: float, at16: float, at32: float, n: int = 40) -> np.ndarray:
    """Descending dual scores with the given values at ranks 0, 1, 16 and 32 (others in between)."""
    s = np.empty(n, np.float32)
    s[0], s[1:16] = top, np.linspace(second, at16, 16)[:-1]
    s[16:32] = np.linspace(at16, at32, 17)[:-1]
    s[32:] = np.linspace(at32, at32 - 0.1, n - 32)
    return s


POLICY = RerankPolicy((0, 16, 32), (0.05, 0.10, None))


@pytest.mark.parametrize(
    ("scores", "rerank_k", "expected"),
    [
        (shortlist(0.9, 0.84, 0.7, 0.6), 128, 0),  # gap 0.06 >= 0.05: the dual answer is clear
        (shortlist(0.9, 0.86, 0.79, 0.6), 128, 16),  # gap 0.04; s[0] - s[16] = 0.11
        (shortlist(0.9, 0.86, 0.81, 0.6), 128, 40),  # 0.09 at 16, depth 32 never: the whole shortlist
        (shortlist(0.9, 0.86, 0.81, 0.6), 30, 30),  # ... but at most rerank_k
        (shortlist(0.9, 0.86, 0.81, 0.6), 10, 10),  # depth 16 covers a head of 10: no gap needed
        (shortlist(0.9, 0.86, 0.81, 0.6), 1, 0),  # a head of one is never re-ranked
        (np.array([0.5], np.float32), 128, 0),
        (np.zeros(0, np.float32), 128, 0),
    ],
)
def test_depth_decision(scores: np.ndarray, rerank_k: int, expected: int) -> None:
    assert POLICY.depth(scores, rerank_k) == expected


def test_a_policy_without_safe_gaps_always_re_ranks_in_full() -> None:
    never = RerankPolicy(DEPTHS, (None, None, None))
    assert never.depth(shortlist(0.9, 0.1, 0.05, 0.0), 128) == 40


def test_policy_round_trip_and_validation() -> None:
    policy = RerankPolicy((0, 16, 32), (0.01, 0.0, None), measured={"queries": 3})
    again = RerankPolicy.from_dict(policy.to_dict())
    assert again == policy and again.measured == {"queries": 3}
    with pytest.raises(ValueError, match="one min_gap per depth"):
        RerankPolicy((0, 16), (0.1,))
    with pytest.raises(ValueError, match="ascending"):
        RerankPolicy((16, 0), (0.1, 0.1))


def test_winner_ranks_take_the_first_maximum_and_skip_missing() -> None:
    combined = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, np.nan, np.nan, np.nan], [0.0, 1.0, np.nan, 9.0]])
    assert winner_ranks(combined).tolist() == [1, 0, 3]


def test_depth_gaps_read_one_position_and_cover_short_shortlists() -> None:
    scores = np.array([[0.9, 0.8, 0.5], [0.7, np.nan, np.nan]], np.float32)
    np.testing.assert_allclose(depth_gaps(scores, 0), [0.1, np.inf], rtol=1e-6)
    np.testing.assert_allclose(depth_gaps(scores, 2), [0.4, np.inf], rtol=1e-6)
    assert np.isinf(depth_gaps(scores, 16)).all()


def test_fit_min_gap_is_just_above_the_allowed_errors() -> None:
    gaps = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    wrong = np.array([False, True, False, True, False])
    assert fit_min_gap(gaps, wrong, 0) == np.nextafter(0.4, np.inf)
    assert fit_min_gap(gaps, wrong, 1) == np.nextafter(0.2, np.inf)
    assert fit_min_gap(gaps, wrong, 2) == 0.0


def test_fit_against_a_hand_computed_reference() -> None:
    # Four shortlists of 40: gaps at depth 0 (s0 - s1) 0.02, 0.04, 0.06, 0.08; at 16 (s0 - s16) 0.2 .. 0.5.
    scores = np.stack(
        [
            shortlist(0.9, 0.9 - g0, 0.9 - g16, 0.2)
            for g0, g16 in [(0.02, 0.2), (0.04, 0.3), (0.06, 0.4), (0.08, 0.5)]
        ]
    )
    # Full re-rank winners at dual ranks 3, 0, 1, 0: depth 0 is wrong for the 1st and 3rd (largest wrong gap
    # 0.06), depth 16 and 32 never.
    winners = np.array([3, 0, 1, 0])
    policy = fit(scores, winners)
    assert policy.depths == DEPTHS
    # No error allowed among 4 queries: depth 0 from just above 0.06 (rounded up to 6 decimals).
    assert policy.min_gaps[0] == pytest.approx(math.ceil(float(scores[2, 0] - scores[2, 1]) * 1e6) / 1e6)
    assert policy.min_gaps[1:] == (0.0, 0.0)
    assert [policy.depth(s, 128) for s in scores] == [16, 16, 16, 0]
    assert measure(policy, scores, winners, 40) == {
        "queries": 4,
        "top1_agreement": 1.0,
        "mean_candidates": 12.0,
        "full_candidates": 40,
        "share_by_depth": {"0": 0.25, "16": 0.75, "32": 0.0, "40": 0.0},
    }


def test_calibrate_fits_all_and_cross_validates() -> None:
    rng = np.random.default_rng(0)
    scores = -np.sort(-rng.uniform(0.0, 1.0, (50, 40)), axis=1).astype(np.float32)
    combined = np.full((50, 40), -1.0, np.float32)
    combined[:, 0] = 1.0  # the full re-rank always keeps the dual top hit
    policy = calibrate(scores, combined)
    assert policy.min_gaps == (0.0, 0.0, 0.0)
    assert policy.measured["cv_top1_agreement"] == 1.0 and policy.measured["cv_mean_candidates"] == 0.0
    assert policy.measured["share_by_depth"]["0"] == 1.0


def test_setting_accepts_adaptive_and_full_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().rerank_policy == "adaptive"
    monkeypatch.setenv("CCRK_RERANK_POLICY", "full")
    assert Settings().rerank_policy == "full"
    monkeypatch.setenv("CCRK_RERANK_POLICY", "sometimes")
    with pytest.raises(ValidationError, match="rerank_policy"):
        Settings()
    monkeypatch.delenv("CCRK_RERANK_POLICY")
    assert Settings().rerank_policy_queries == 300
    monkeypatch.setenv("CCRK_RERANK_POLICY_QUERIES", "-1")
    with pytest.raises(ValidationError, match="rerank_policy_queries"):
        Settings()


def test_a_build_records_a_cross_validated_policy(settings: Settings, catalogue: Path) -> None:
    build("off", [catalogue / "test.jsonl"], settings=settings)  # the fixture's: no calibration
    with IndexVersion.open(settings.index_root, "off") as idx:
        assert "policy" not in idx.manifest.rerank
    settings = settings.model_copy(update={"rerank_policy_queries": 300})
    build("pol", [catalogue / "test.jsonl"], settings=settings)
    with IndexVersion.open(settings.index_root, "pol") as idx:
        recorded = idx.manifest.rerank["policy"]
    policy = RerankPolicy.from_dict(recorded)
    assert policy.depths == DEPTHS and policy.score == "dual_plus_margin"
    # 40 items: the calibration re-ranks all 40 for 80 of their 400 first captions (two per item).
    assert policy.measured["queries"] == 80 and policy.measured["full_candidates"] == 40
    assert 0.0 <= policy.measured["cv_mean_candidates"] <= 40
    assert policy.measured["cv_top1_agreement"] >= 0.9
