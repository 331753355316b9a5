"""Choosing the fusion method by cross-validation (indexer.fusion_calibration) and the smoothed label cut
(indexer.fusion_fitting._cut), on small synthetic samples against plain references."""

from __future__ import annotations

import numpy as np

from indexer.fusion_calibration import FOLDS, choose_method, cross_validated
from indexer.fusion_fitting import _cut, fit, r_precision
from store.products.hybrid import fuse
from tests.indexer.fusion_samples import samples as draw_samples


def test_each_sample_is_scored_once_by_its_groups_fit_on_the_other_folds() -> None:
    """Two small groups fitted on the same pooled samples: each group's own samples are scored once, by the
    fit on the pool's other folds; a pooled list shared by two groups is not scored twice."""
    rng = np.random.default_rng(0)
    samples = draw_samples(rng, 40)
    fold = (np.arange(40) // 2) % FOLDS
    pool = list(range(30))
    members = {"en": pool, "de": pool, "other": list(range(30, 40))}
    own = {"en": list(range(0, 30, 2)), "de": list(range(1, 30, 2)), "other": list(range(30, 40))}
    got = cross_validated("weighted", samples, members, own, fold)
    expected = np.full(40, np.nan)
    for group, idx in members.items():
        for k in range(FOLDS):
            params = fit("weighted", [samples[i] for i in idx if fold[i] != k], "hybrid")
            for i in (i for i in own[group] if fold[i] == k):
                s = samples[i]
                expected[i] = r_precision(fuse("weighted", s.candidates, params, "hybrid"), s.labels, 2)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, expected)


def test_a_method_is_chosen_over_a_simpler_one_only_when_it_wins_by_more_than_its_error() -> None:
    rng = np.random.default_rng(1)
    base = rng.uniform(0.3, 0.9, size=200)
    noise = rng.normal(0.0, 0.1, size=200)
    noisy_gain = base + noise - noise.mean() + 0.005  # ahead by 0.005 on average, well within its noise
    clear_gain = base + 0.05 + rng.normal(0.0, 0.01, size=200)
    query_of = np.arange(200) // 2
    assert (
        choose_method({"rrf": base - 0.2, "weighted": base, "logistic": noisy_gain}, query_of) == "weighted"
    )
    assert (
        choose_method({"rrf": base - 0.2, "weighted": base, "logistic": clear_gain}, query_of) == "logistic"
    )
    assert choose_method({"rrf": base, "weighted": base - 0.1, "logistic": base - 0.1}, query_of) == "rrf"


def test_the_error_counts_a_pseudo_querys_two_askings_as_one() -> None:
    """Each query's two askings differ by the same amount: counted as independent samples, the error would
    be sqrt(2) smaller and the logistic fit, ahead by less than its error per query, chosen."""
    rng = np.random.default_rng(3)
    per_query = rng.normal(0.0, 0.1, size=100)
    per_query += 0.009 - per_query.mean()
    base = rng.uniform(0.3, 0.9, size=200)
    ahead = base + np.repeat(per_query, 2)
    sums = 2 * per_query
    error = sums.std(ddof=1) / np.sqrt(100) * 100 / 200
    assert error > 0.009 > per_query.std(ddof=1) / np.sqrt(200)  # within one error per query, not per sample
    out_of_fold = {"rrf": base - 0.3, "weighted": base, "logistic": ahead}
    assert choose_method(out_of_fold, np.arange(200) // 2) == "weighted"
    assert choose_method(out_of_fold, np.arange(200)) == "logistic"


def test_the_label_cut_moves_less_with_the_draw_than_the_raw_best_cut() -> None:
    """Matches ~ N(0.6, 0.1), no-matches ~ N(0.4, 0.1): equally dense at 0.5. Over 40 draws of 80 each,
    the smoothed cut stays near 0.5 and spreads less than the raw sum-of-rates argmax."""

    rng = np.random.default_rng(2)
    smooth, raw = [], []
    for _ in range(40):
        ins, outs = rng.normal(0.6, 0.1, 80), rng.normal(0.4, 0.1, 80)
        smooth.append(_cut(ins, outs))
        values = np.unique(np.concatenate([ins, outs]))
        cuts = (values[:-1] + values[1:]) / 2
        raw.append(float(max(cuts, key=lambda t: (ins >= t).mean() + (outs < t).mean())))
    assert abs(np.mean(smooth) - 0.5) < 0.02
    assert np.std(smooth) < 0.7 * np.std(raw)
