"""Match labels of a hybrid query whose language is uncertain (``service.search.hybrid.HybridRanker``)."""

from __future__ import annotations

import numpy as np

from service.search.hybrid import HybridRanker, label_of
from store.hybrid import FEATURES, MATCH_FEATURES, OTHER, Candidates, FusionModel, GroupParams, match_scores


def _params(bias: float, none_below: float | None = 0.5) -> GroupParams:
    """A group whose match model ignores the features: every candidate's probability is sigmoid(bias)."""
    return GroupParams(
        weights=[0.2] * len(FEATURES),
        none_below=none_below,
        strong_from=0.8,
        match=[0.0] * len(MATCH_FEATURES) + [bias],
        features=list(FEATURES),
        match_features=list(MATCH_FEATURES),
        match_over="any",
    )


def _candidates(n: int = 3) -> Candidates:
    rng = np.random.default_rng(0)
    return Candidates(
        rows=np.arange(n, dtype=np.int64),
        features=rng.random((n, len(FEATURES))).astype(np.float32),
        ranks=np.tile(np.arange(n, dtype=np.int64)[:, None], (1, 3)),
        photo=np.zeros(n, np.int64),
        text=np.zeros(n, np.int64),
        lexical=np.full(n, -1, np.int64),
    )


def _labels(english: GroupParams, other: GroupParams) -> tuple[GroupParams, np.ndarray, float | None]:
    fusion = FusionModel("weighted", {"en": english, OTHER: other}, {}, ["en"])
    cands = _candidates()
    scores = fusion.score(cands, "hybrid", "en")
    quality = match_scores(cands, english, "hybrid", scores)
    order = np.argsort(-scores, kind="stable")
    return HybridRanker._uncertain_labels(
        fusion, cands, "hybrid", order, english, quality, float(quality.max())
    )


def test_an_uncertain_query_takes_the_other_groups_better_label() -> None:
    english, other = _params(bias=-2.0), _params(bias=0.5)  # probabilities 0.12 (none) and 0.62 (weak)
    params, quality, top = _labels(english, other)
    assert params is other
    assert top is not None and abs(top - 1 / (1 + np.exp(-0.5))) < 1e-6
    np.testing.assert_allclose(quality, np.full(3, 1 / (1 + np.exp(-0.5))), rtol=1e-6)
    assert label_of(top, params) == "weak"


def test_the_detected_languages_labels_stay_when_the_other_group_is_no_better() -> None:
    english, other = _params(bias=0.4), _params(bias=0.6)  # both weak: no reason to leave the detected one
    params, _, top = _labels(english, other)
    assert params is english and top is not None and abs(top - 1 / (1 + np.exp(-0.4))) < 1e-6
    english, other = _params(bias=-2.0), _params(bias=0.5, none_below=None)  # nothing calibrated there
    assert _labels(english, other)[0] is english
