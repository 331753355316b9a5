"""The fusion fits (indexer.fusion_fitting) on small synthetic candidate sets, against plain references."""

from __future__ import annotations

import re

import numpy as np
import pytest

from indexer.fusion_fitting import (
    FIT_FEATURES,
    FIT_MATCH_FEATURES,
    MATCH_REFITS,
    _top_features,
    fit,
    fit_columns,
    fit_match,
    fit_weighted,
    r_precision,
    simplex_grid,
)
from store.errors import IndexFormatError
from store.products.hybrid import (
    CANDIDATES,
    CHANNELS,
    FEATURES,
    MATCH_FEATURES,
    FusionModel,
    GroupParams,
    match_columns,
    match_scores,
    query_match_score,
)
from tests.indexer.fusion_samples import candidates, samples


def test_a_fit_names_its_features_and_its_label_reads_any_candidate() -> None:
    params = fit("weighted", samples(np.random.default_rng(0)), "hybrid")
    assert params.features == list(FIT_FEATURES) and params.match_over == "any"
    assert len(params.weights) == len(FIT_FEATURES) and "lexical" not in params.features
    text = fit("logistic", samples(np.random.default_rng(1)), "text")
    assert len(text.weights) == len(FIT_FEATURES) - 1  # the image left out
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
    the top-ranked candidate, as they were fitted to; new ones the best match score of the candidates in
    some channel's first ``CANDIDATES`` (a deeper page, which gathers more, does not move it)."""
    x = np.asarray([[0.1, 0.2, 0.0, 0.0, 0.3], [0.9, 0.8, 1.0, 1.0, 0.7], [1.0, 1.0, 1.0, 1.0, 1.0]])
    cands = candidates(x)
    cands.ranks[:, 0] = [0, 1, CANDIDATES]  # the third found only past the calibrated depth
    legacy = FusionModel.from_dict(
        {
            "method": "weighted",
            "hybrid": {"other": {"weights": [1, 0, 0, 0], "match": [1.0, 1.0, 1.0, -1.0]}},
            "text": {"other": {"weights": [0, 1, 0]}},
        }
    ).hybrid["other"]
    assert legacy.match_over == "top" and legacy.match_features == []
    order = np.asarray([0, 1, 2])  # the weakest candidate ranked first
    quality = match_scores(cands, legacy, "hybrid", np.zeros(3, np.float32))
    expected = 1 / (1 + np.exp(-(x[:, :3].sum(axis=1) - 1.0)))
    np.testing.assert_allclose(quality, expected, atol=1e-6)
    assert query_match_score(cands, quality, order, legacy) == quality[0]
    new = GroupParams(weights=[], match=[1.0, 1.0, 1.0, -1.0], match_over="any")
    assert query_match_score(cands, quality, order, new) == quality[1]
    assert query_match_score(cands, quality[:0], order[:0], new) is None


def test_the_grid_fit_equals_scoring_one_grid_point_at_a_time() -> None:
    """``fit_weighted`` scores every simplex point at once; the reference scores them one by one and keeps
    the first best (as the fit did before): the same weights, on several draws and both modes."""
    for seed in range(3):
        train = samples(np.random.default_rng(seed), 40)
        for mode in ("hybrid", "text"):
            cols = fit_columns(mode)
            x_all = np.concatenate([s.candidates.features[:, cols] for s in train]).astype(np.float64)
            mean, std = x_all.mean(axis=0), x_all.std(axis=0)
            best, chosen = -1.0, None
            for point in simplex_grid(len(cols), 0.1).tolist():
                score = float(
                    np.mean(
                        [
                            r_precision(((s.candidates.features[:, cols] - mean) / std) @ point, s.labels, 2)
                            for s in train
                        ]
                    )
                )
                if score > best + 1e-9:
                    best, chosen = score, point
            np.testing.assert_allclose(fit_weighted(train, mode).weights, chosen, atol=1e-12)


def test_the_match_model_is_refitted_on_the_candidates_it_scores_highest() -> None:
    """``fit_match`` with ``match_over`` "any": a first fit on the top-fused candidates, then refits, each on
    the candidates the previous model scores highest; against a plain loop of the same rounds."""
    rng = np.random.default_rng(4)
    train = samples(rng)
    no_match = [candidates(rng.uniform(0.0, 0.4, size=(8, len(FEATURES)))) for _ in range(10)]
    params = fit("weighted", train, "hybrid")
    reference = GroupParams(**params.to_dict())
    fit_match("weighted", params, train, "hybrid", no_match)
    reference.match = []
    for _ in range(1 + MATCH_REFITS):
        pos, neg = _top_features("weighted", reference, train, "hybrid", no_match)
        x = np.concatenate([pos, neg])
        y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
        weight = np.where(y > 0, 0.5 / len(pos), 0.5 / len(neg))
        w, b = np.zeros(x.shape[1]), 0.0
        for _ in range(2000):
            g = (1 / (1 + np.exp(-(x @ w + b))) - y) * weight
            w, b = np.maximum(w - 4.0 * (x.T @ g + 1e-3 * w), 0.0), b - 4.0 * float(g.sum())
        reference.match = [*w.tolist(), b]
    np.testing.assert_allclose(params.match, reference.match, atol=1e-9)
    once = GroupParams(**params.to_dict())
    once.match_over = "top"  # one round: the top-fused candidates only
    fit_match("weighted", once, train, "hybrid", no_match)
    assert not np.allclose(once.match, params.match, atol=1e-6)


def test_the_match_models_weights_are_never_negative() -> None:
    """A channel's match never lowers the match probability: a feature that runs against the labels (here the
    image cosine, high for irrelevant candidates) gets weight 0, not a negative one, and the others keep
    telling matches apart."""
    rng = np.random.default_rng(5)
    train = samples(rng)
    for s in train:
        s.candidates.features[:, 0] = np.where(s.labels, 0.1, 0.9)  # the photos point the wrong way
    no_match = [candidates(rng.uniform(0.0, 0.4, size=(8, len(FEATURES)))) for _ in range(10)]
    params = fit("weighted", train, "hybrid")
    fit_match("weighted", params, train, "hybrid", no_match)
    weights = np.asarray(params.match[:-1])
    assert weights.min() >= 0.0 and weights[list(MATCH_FEATURES).index("image")] == 0.0
    assert weights.max() > 0.0


def test_a_match_feature_every_calibration_match_holds_at_its_maximum_is_left_out() -> None:
    """Lexical coverage 1 for every match (a catalogue with one text field: relevance is holding every term
    of the pseudo-query, so each match covers it fully) says how the pseudo-queries were made: the match
    model leaves it out and reads the cosines, so a shopper's query with a word no title holds is not
    labelled none on that alone. Where matches cover it partly, the feature stays."""
    rng = np.random.default_rng(6)
    no_match = [candidates(rng.uniform(0.0, 0.4, size=(8, len(FEATURES)))) for _ in range(10)]
    lexical = CHANNELS.index("lexical")  # the channel the coverage feature is read from
    coverage = FEATURES.index("coverage")
    varied = samples(rng)
    for s in varied:
        s.candidates.ranks[:, lexical] = np.arange(len(s.candidates))  # every candidate found lexically
    params = fit("weighted", varied, "hybrid")
    fit_match("weighted", params, varied, "hybrid", no_match)
    assert params.match_features == list(FIT_MATCH_FEATURES) and len(params.match) == 4
    full = samples(rng)
    for s in full:
        partial = rng.uniform(0.0, 0.6, size=s.labels.size)
        s.candidates.features[:, coverage] = np.where(s.labels, 1.0, partial)
        s.candidates.ranks[:, lexical] = np.arange(len(s.candidates))
        # A relevant product the lexical channel did not gather (none of its words among its first ranks)
        # has no coverage: not evidence against the rule, which reads the ones it found.
        missed = int(np.flatnonzero(s.labels)[0])
        s.candidates.features[missed, coverage], s.candidates.ranks[missed, lexical] = 0.0, -1
    for mode in ("hybrid", "text"):
        params = fit("weighted", full, mode)
        fit_match("weighted", params, full, mode, no_match)
        assert params.match_features == ["image", "text"]
        assert len(params.match) == len(match_columns(mode, params)) + 1 == (3 if mode == "hybrid" else 2)
        # A match's probability no longer falls with its coverage: 0.3 scores as 1.0 does.
        x = np.array([[0.6, 0.8, 1.0, 1.0, 0.8, 1.0], [0.6, 0.8, 1.0, 1.0, 0.8, 0.3]], np.float32)
        scores = match_scores(candidates(x), params, mode, np.zeros(2, np.float32))
        assert scores[0] == scores[1] and params.none_below is not None


@pytest.mark.parametrize(
    ("stored", "problem"),
    [
        ({"weights": [1.0, 0.0, 0.0, 0.0, 0.0], "features": ["image", "text", "lexical", "bm25", "x"]}, "x"),
        ({"weights": [1.0, 0.0, 0.0, 0.0, 0.0], "features": list(FEATURES), "match_over": "all"}, "'all'"),
        ({"weights": [1.0, 0.0, 0.0], "features": list(FEATURES)}, "3 weights for 6 features"),
        ({"weights": [1.0, 0.0, 0.0, 0.0], "match": [1.0, 1.0]}, "2 match weights"),
    ],
)
def test_stored_parameters_that_do_not_fit_their_features_are_refused(stored: dict, problem: str) -> None:
    with pytest.raises(IndexFormatError, match=re.escape(problem)):
        FusionModel.from_dict({"method": "weighted", "hybrid": {"other": stored}})
