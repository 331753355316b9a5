"""The fusion fits (indexer.fusion_fitting) on small synthetic candidate sets, against plain references."""

from __future__ import annotations

import numpy as np

from indexer.fusion_fitting import FIT_FEATURES, Sample, _top_features, fit, fit_match
from store.hybrid import (
    CHANNELS,
    FEATURES,
    Candidates,
    FusionModel,
    GroupParams,
    match_columns,
    match_scores,
    query_match_score,
)


def candidates(features: np.ndarray) -> Candidates:
    n = features.shape[0]
    none = np.full(n, -1, np.int64)
    ranks = np.full((n, len(CHANNELS)), -1, np.int64)
    return Candidates(np.arange(n, dtype=np.int64), features.astype(np.float32), ranks, none, none, none)


def samples(rng: np.random.Generator, n: int = 60) -> list[Sample]:
    """Pseudo-queries whose relevant candidates have higher text and lexical features (and noise)."""
    out = []
    for _ in range(n):
        labels = np.zeros(12, bool)
        labels[rng.choice(12, size=2, replace=False)] = True
        x = rng.uniform(0.0, 0.5, size=(12, len(FEATURES)))
        x[labels, 1] += 0.3
        x[labels, 2] += 0.4
        out.append(Sample("en", candidates(x), labels, 2))
    return out


def test_a_fit_names_its_features_and_its_label_reads_any_candidate() -> None:
    params = fit("weighted", samples(np.random.default_rng(0)), "hybrid")
    assert params.features == list(FIT_FEATURES) and params.match_over == "any"
    assert len(params.weights) == len(FEATURES)
    text = fit("logistic", samples(np.random.default_rng(1)), "text")
    assert len(text.weights) == len(FEATURES) - 1  # the image left out
    stored = FusionModel("weighted", {"other": params}, {"other": text}).to_dict()
    assert FusionModel.from_dict(stored).hybrid["other"] == params


def test_the_match_model_reads_the_candidates_it_scores_highest() -> None:
    """With ``match_over`` "any" and a model fitted, each pseudo-query's match example is its relevant
    candidate the model scores highest (not the top-fused one), its no-match example likewise among the
    irrelevant ones and the other-domain queries' candidates: against a plain loop."""
    rng = np.random.default_rng(2)
    train = samples(rng)
    no_match = [candidates(rng.uniform(0.0, 0.4, size=(8, len(FEATURES)))) for _ in range(10)]
    params = fit("weighted", train, "hybrid")
    fit_match("weighted", params, train, "hybrid", no_match)
    assert params.match and params.none_below is not None
    cols = match_columns("hybrid", params)
    w = np.asarray(params.match[:-1])
    pos, neg = _top_features("weighted", params, train, "hybrid", no_match)
    expected_pos, expected_neg = [], []
    for s in train:
        x = s.candidates.features[:, cols].astype(np.float64)
        score = x @ w
        for mask, out in ((s.labels, expected_pos), (~s.labels, expected_neg)):
            idx = [i for i in range(len(score)) if mask[i]]
            out.append(x[max(idx, key=lambda i: score[i])])
    for c in no_match:
        x = c.features[:, cols].astype(np.float64)
        expected_neg.append(x[int(np.argmax(x @ w))])
    np.testing.assert_allclose(pos, expected_pos, atol=1e-6)
    np.testing.assert_allclose(neg, expected_neg, atol=1e-6)


def test_a_querys_label_reads_its_top_candidate_or_its_best_one() -> None:
    """``query_match_score``: parameters fitted before the centroid feature (no ``match_over`` stored) read
    the top-ranked candidate, as they were fitted to; new ones the best match score of any candidate."""
    x = np.asarray([[0.1, 0.2, 0.0, 0.0, 0.3], [0.9, 0.8, 1.0, 1.0, 0.7]])
    cands = candidates(x)
    legacy = FusionModel.from_dict(
        {"method": "weighted", "hybrid": {"other": {"weights": [1, 0, 0, 0], "match": [1.0, 1.0, 1.0, -1.0]}}}
    ).hybrid["other"]
    assert legacy.match_over == "top" and legacy.match_features == []
    order = np.asarray([0, 1])  # the weaker candidate ranked first
    quality = match_scores(cands, legacy, "hybrid", np.zeros(2, np.float32))
    expected = 1 / (1 + np.exp(-(x[:, :3].sum(axis=1) - 1.0)))
    np.testing.assert_allclose(quality, expected, atol=1e-6)
    assert query_match_score(quality, order, legacy) == quality[0]
    new = GroupParams(weights=[], match=[1.0, 1.0, 1.0, -1.0], match_over="any")
    assert query_match_score(quality, order, new) == quality[1]
    assert query_match_score(quality[:0], order[:0], new) is None
