"""Choosing the fusion method by cross-validation (indexer.fusion_calibration) and the smoothed label cut
(indexer.fusion_fitting._cut), on small synthetic samples against plain references."""

from __future__ import annotations

import numpy as np

from indexer.fusion_calibration import FOLDS, choose_method, cross_validated
from indexer.fusion_fitting import Sample, _cut, fit, r_precision
from store.hybrid import CHANNELS, FEATURES, Candidates, fuse


def _samples(rng: np.random.Generator, n: int) -> list[Sample]:
    out = []
    for _ in range(n):
        labels = np.zeros(10, bool)
        labels[rng.choice(10, size=2, replace=False)] = True
        x = rng.uniform(0.0, 0.5, size=(10, len(FEATURES)))
        x[labels, 1] += 0.25
        none = np.full(10, -1, np.int64)
        ranks = np.full((10, len(CHANNELS)), -1, np.int64)
        cands = Candidates(np.arange(10, dtype=np.int64), x.astype(np.float32), ranks, none, none, none)
        out.append(Sample("en", cands, labels, 2))
    return out


def test_each_sample_is_scored_once_by_the_fit_on_the_other_folds() -> None:
    rng = np.random.default_rng(0)
    samples = _samples(rng, 30)
    fold = np.arange(30) % FOLDS
    members = {"en": list(range(20)), "other": list(range(20, 30))}
    got = cross_validated("weighted", samples, members, fold)
    expected = []
    for idx in members.values():
        for k in range(FOLDS):
            params = fit("weighted", [samples[i] for i in idx if fold[i] != k], "hybrid")
            for i in (i for i in idx if fold[i] == k):
                s = samples[i]
                expected.append(r_precision(fuse("weighted", s.candidates, params, "hybrid"), s.labels, 2))
    assert got == expected and len(got) == 30


def test_a_method_is_chosen_over_a_simpler_one_only_when_it_wins_by_more_than_its_error() -> None:
    rng = np.random.default_rng(1)
    base = rng.uniform(0.3, 0.9, size=200)
    noise = rng.normal(0.0, 0.1, size=200)
    noisy_gain = base + noise - noise.mean() + 0.005  # ahead by 0.005 on average, well within its noise
    clear_gain = base + 0.05 + rng.normal(0.0, 0.01, size=200)
    assert np.mean(noisy_gain) > np.mean(base)
    assert choose_method({"rrf": list(base - 0.2), "weighted": list(base), "logistic": list(noisy_gain)}) == (
        "weighted"
    )
    assert choose_method({"rrf": list(base - 0.2), "weighted": list(base), "logistic": list(clear_gain)}) == (
        "logistic"
    )
    assert choose_method({"rrf": list(base), "weighted": list(base - 0.1), "logistic": list(base - 0.1)}) == (
        "rrf"
    )


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
