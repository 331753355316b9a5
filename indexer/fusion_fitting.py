"""Fitting the fusion of one language group on asked pseudo-queries (``indexer.fusion_calibration``): the
ranking methods (a weighted sum of standardised features on a simplex grid, logistic regression; reciprocal-
rank fusion needs nothing), their held-out R-precision, and the match model behind the labels with its
thresholds. numpy only."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from store.products.hybrid import (
    CHANNELS,
    FEATURE_CHANNEL,
    FEATURES,
    MATCH_FEATURES,
    Candidates,
    GroupParams,
    columns_of,
    fuse,
    match_columns,
    mode_features,
)

# What a fit reads: every channel's features for ranking; for the match model, the raw ones (the BM25 score
# is relative to the query's best, so not comparable across queries). The term coverage over every value of
# a product stands in for its best BM25 value's (``store.products.hybrid``; fusions fitted before calibration
# code 4
# keep reading ``lexical``, as their parameters name it).
FIT_FEATURES = ("image", "text", "coverage", "bm25", "centroid")
FIT_MATCH_FEATURES = ("image", "text", "coverage")
# Refits of a match model on the candidates it scores highest (``fit_match``).
MATCH_REFITS = 3


def fit_columns(mode: str) -> list[int]:
    return columns_of(FIT_FEATURES, mode)


def _params(
    weights: list[float], bias: float = 0.0, mean: list[float] | None = None, std: list[float] | None = None
) -> GroupParams:
    """Parameters of a fit, naming the features they are over."""
    return GroupParams(
        weights=weights,
        bias=bias,
        mean=mean or [],
        std=std or [],
        features=list(FIT_FEATURES),
        match_features=list(FIT_MATCH_FEATURES),
        match_over="any",
    )


@dataclass
class Sample:
    """One asked pseudo-query: its candidates and which are relevant."""

    group: str
    candidates: Candidates
    labels: np.ndarray  # (n,) bool
    relevant: int  # R, the number of relevant products (some may be missing from the candidates)


def r_precision(scores: np.ndarray, labels: np.ndarray, relevant: int) -> float:
    if relevant == 0:
        return 0.0
    top = np.argsort(-scores, kind="stable")[:relevant]
    return float(labels[top].sum()) / relevant


def _standardise(samples: Sequence[Sample], mode: str) -> tuple[np.ndarray, np.ndarray]:
    x = np.concatenate([s.candidates.features[:, fit_columns(mode)] for s in samples]).astype(np.float64)
    mean, std = x.mean(axis=0), x.std(axis=0)
    return mean, np.where(std > 1e-6, std, 1.0)


def fit_logistic(samples: Sequence[Sample], mode: str, l2: float = 1e-2, steps: int = 400) -> GroupParams:
    """Logistic regression (balanced classes, L2) on standardised features by gradient descent."""
    mean, std = _standardise(samples, mode)
    x = (np.concatenate([s.candidates.features[:, fit_columns(mode)] for s in samples]) - mean) / std
    y = np.concatenate([s.labels for s in samples]).astype(np.float64)
    pos = max(y.sum(), 1.0)
    neg = max(len(y) - y.sum(), 1.0)
    weight = np.where(y > 0, 0.5 / pos, 0.5 / neg)
    w = np.zeros(x.shape[1])
    b = 0.0
    lr = 1.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
        g = (p - y) * weight
        w -= lr * (x.T @ g + l2 * w)
        b -= lr * float(g.sum())
    return _params(weights=w.tolist(), bias=b, mean=mean.tolist(), std=std.tolist())


def simplex_grid(k: int, step: float) -> np.ndarray:
    """(points, k) weights on the simplex at ``step``, in ``itertools.product`` order of the first k - 1."""
    ticks = round(1 / step)
    points = [
        [c * step for c in combo] + [(ticks - sum(combo)) * step]
        for combo in itertools.product(range(ticks + 1), repeat=k - 1)
        if sum(combo) <= ticks
    ]
    return np.asarray(points, np.float64)


def fit_weighted(samples: Sequence[Sample], mode: str, step: float = 0.1) -> GroupParams:
    """A weighted sum of standardised features, weights on the simplex grid, best training R-precision (the
    first grid point reaching it). Every point is scored at once per sample: one product by the grid's
    weight matrix and one sort per column (5 features: 1,001 points, ~15x faster than a point at a time)."""
    mean, std = _standardise(samples, mode)
    k = len(fit_columns(mode))
    step = step if k <= 5 else 2 * step  # 5 features: 1,001 grid points; 6 would be 3,003 (then 252)
    grid = simplex_grid(k, step)
    totals = np.zeros(len(grid))
    for s in samples:
        if s.relevant == 0:  # r_precision 0 at every point
            continue
        x = (s.candidates.features[:, fit_columns(mode)] - mean) / std
        top = np.argsort(-(x @ grid.T), axis=0, kind="stable")[: s.relevant]  # (R, points)
        totals += s.labels[top].sum(axis=0) / s.relevant
    scores = totals / max(len(samples), 1)
    best_score, best = -1.0, [1.0 / k] * k
    for point, score in zip(grid.tolist(), scores.tolist(), strict=True):
        if score > best_score + 1e-9:
            best_score, best = score, point
    return _params(weights=best, mean=mean.tolist(), std=std.tolist())


def evaluate(method: str, params: GroupParams, samples: Sequence[Sample], mode: str) -> float:
    scores = r_precisions(method, params, samples, mode)
    return float(np.mean(scores)) if scores else 0.0


def r_precisions(method: str, params: GroupParams, samples: Sequence[Sample], mode: str) -> list[float]:
    """Each sample's R-precision under the fused order."""
    return [r_precision(fuse(method, s.candidates, params, mode), s.labels, s.relevant) for s in samples]


def _top_features(
    method: str, params: GroupParams, samples: Sequence[Sample], mode: str, no_match: Sequence[Candidates]
) -> tuple[np.ndarray, np.ndarray]:
    """The match features of what a query's label reads: for each pseudo-query its best relevant candidate
    (a match) and its best irrelevant one (what a query for a product the shop does not sell would meet),
    and each other-domain query's best candidate (no match). "Best": the top-fused one, or where the label
    reads any candidate (``GroupParams.match_over``, with a match model already fitted), the one the match
    model scores highest."""
    cols = match_columns(mode, params)
    by_match = params.match_over == "any" and bool(params.match)
    w = np.asarray(params.match[:-1], np.float64) if by_match else None

    def ranking(cands: Candidates) -> np.ndarray:
        if w is not None:
            return cands.features[:, cols].astype(np.float64) @ w  # the probability's order
        return fuse(method, cands, params, mode)

    pos, neg = [], []
    for s in samples:
        score = ranking(s.candidates)
        x = s.candidates.features[:, cols]
        for mask, out in ((s.labels, pos), (~s.labels, neg)):
            idx = np.flatnonzero(mask)
            if idx.size:
                out.append(x[_best(score, x, idx)])
    for cands in no_match:
        if len(cands):
            x = cands.features[:, cols]
            neg.append(x[_best(ranking(cands), x, np.arange(len(cands)))])
    width = len(cols)
    return np.asarray(pos, np.float64).reshape(-1, width), np.asarray(neg, np.float64).reshape(-1, width)


def _best(score: np.ndarray, x: np.ndarray, idx: np.ndarray) -> int:
    """The candidate among ``idx`` with the highest ``score``, ties broken by its features ``x`` (largest
    first, column by column), not by its position: a sharded version numbers the same products otherwise,
    and a match model with a weight at 0 ties candidates that differ only in that feature."""
    keys = [x[idx, j] for j in reversed(range(x.shape[1]))]
    return int(idx[np.lexsort([*keys, score[idx]])[-1]])


def _cut(ins: np.ndarray, outs: np.ndarray) -> float:
    """The boundary with the largest sum of both rates, each rate smoothed by a logistic kernel of each
    side's own bandwidth (Silverman's rule): where a match and a no-match are about equally dense. The raw
    sum is a step function, flat over wide stretches between a few hundred scores, whose argmax moves with
    a few scores at its edge: over eight draws of pseudo-queries on the shared grocery catalogue the raw
    argmax of one group ranged 0.45-0.77, the smoothed one 0.49-0.64."""
    lo, hi = float(min(ins.min(), outs.min())), float(max(ins.max(), outs.max()))
    cuts = np.linspace(lo, hi, 801)
    h_in, h_out = _bandwidth(ins), _bandwidth(outs)
    # logistic CDF with the normal's scale (1.702), as tanh (no overflow): a smooth step of width ~h
    kept = 0.5 + 0.5 * np.tanh(0.851 * (ins[None, :] - cuts[:, None]) / h_in)
    rejected = 0.5 + 0.5 * np.tanh(0.851 * (cuts[:, None] - outs[None, :]) / h_out)
    total = kept.mean(axis=1) + rejected.mean(axis=1)
    return float(cuts[int(np.argmax(total))])


def _bandwidth(x: np.ndarray) -> float:
    """Silverman's rule of thumb for a kernel density estimate of ``x`` (the standard deviation where the
    interquartile range is 0: many equal scores)."""
    if len(x) < 2:
        return 1e-3
    std = float(np.std(x))
    iqr = float(np.subtract(*np.percentile(x, [75, 25]))) / 1.34
    spread = min(std, iqr) if iqr > 0 else std
    return max(0.9 * spread * len(x) ** -0.2, 1e-3)


def fit_match(
    method: str, params: GroupParams, samples: Sequence[Sample], mode: str, no_match: Sequence[Candidates]
) -> None:
    """The match model of a group (logistic, balanced, on the raw match features of ``_top_features``, with
    weights kept non-negative: a channel's better match never lowers the probability; unconstrained, the
    correlated cosines of ~120 pseudo-queries took weights of either sign by the draw) and
    the thresholds of its probability, set on ``params``. Where the label reads any candidate
    (``match_over`` "any"), the model is fitted again on the candidates it scores highest (a few rounds,
    from the top-fused ones): what it reads then no longer depends on how the fusion orders the results.

    A feature that every match of the calibration holds at its maximum says how the pseudo-queries were
    made, not how a shopper's query meets the shop's text: it is left out and the model fitted again. That
    is the lexical coverage where the catalogue has one text field: a pseudo-query's relevant products are
    those whose value holds every one of its terms, so each match covers it fully, and the model learnt
    that anything less is no match. On the demo catalogue (German titles) every German caption was labelled
    ``none``, its right product first (40 of 40), and so was "ein roter Becher" ("ein" and "Becher" are in
    no title)."""
    names = mode_features(params.match_features or list(MATCH_FEATURES), mode)
    fixed = _fixed_by_construction(samples, names)
    if fixed and len(fixed) < len(names):
        params.match_features = [n for n in params.match_features or MATCH_FEATURES if n not in fixed]
    _fit_match_rounds(method, params, samples, mode, no_match)


def _fixed_by_construction(samples: Sequence[Sample], names: Sequence[str]) -> set[str]:
    """The match features at their maximum (1) for every relevant candidate their channel found, over all
    the pseudo-queries: what the making of the pseudo-queries fixed. Every relevant candidate, not the
    match model's pick among them, so that a model leaning on a feature cannot confirm it."""
    fixed = set()
    for name in names:
        if name not in FEATURE_CHANNEL:
            continue
        k, j = CHANNELS.index(FEATURE_CHANNEL[name]), FEATURES.index(name)
        found = [s.candidates.features[s.labels & (s.candidates.ranks[:, k] >= 0), j] for s in samples]
        values = np.concatenate(found) if found else np.zeros(0)
        if values.size and bool((values >= 1.0 - 1e-6).all()):
            fixed.add(name)
    return fixed


def _fit_match_rounds(
    method: str, params: GroupParams, samples: Sequence[Sample], mode: str, no_match: Sequence[Candidates]
) -> None:
    """``fit_match``'s fit over ``params.match_features``: its rounds, then the thresholds."""
    rounds = 1 + (MATCH_REFITS if params.match_over == "any" else 0)
    params.match = []  # the first round reads the top-fused candidates
    for _ in range(rounds):
        pos, neg = _top_features(method, params, samples, mode, no_match)
        if not len(pos) or not len(neg):
            return
        x = np.concatenate([pos, neg])
        y = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
        weight = np.where(y > 0, 0.5 / len(pos), 0.5 / len(neg))
        w, b = np.zeros(x.shape[1]), 0.0
        for _ in range(2000):
            p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
            g = (p - y) * weight
            w -= 4.0 * (x.T @ g + 1e-3 * w)
            np.maximum(w, 0.0, out=w)  # monotone: more of any channel's match never lowers the probability
            b -= 4.0 * float(g.sum())
        params.match = [*w.tolist(), b]
    prob = 1.0 / (1.0 + np.exp(-(x @ w + b)))
    ins, outs = prob[: len(pos)], prob[len(pos) :]
    params.none_below = _cut(ins, outs)
    above = ins[ins >= params.none_below]
    params.strong_from = max(float(np.median(above)) if above.size else params.none_below, params.none_below)


def thresholds(
    method: str,
    params: GroupParams,
    samples: Sequence[Sample],
    mode: str,
    no_match: Sequence[Candidates] = (),
) -> dict[str, float]:
    """How the group's labels do on ``samples`` (held out) and the no-match queries: the share of pseudo-
    queries labelled "none" and of no-match ones (their best irrelevant candidate, other-domain queries)."""
    if params.none_below is None:
        return {}
    pos, neg = _top_features(method, params, samples, mode, no_match)
    if not len(pos) or not params.match:
        return {}
    w = np.asarray(params.match)
    ins = 1.0 / (1.0 + np.exp(-(pos @ w[:-1] + w[-1])))
    outs = 1.0 / (1.0 + np.exp(-(neg @ w[:-1] + w[-1])))
    return {
        "none_below": float(params.none_below),
        "strong_from": float(params.strong_from or params.none_below),
        "in_catalogue_labelled_none": round(float((ins < params.none_below).mean()), 4),
        "no_match_labelled_none": round(float((outs < params.none_below).mean()), 4),
    }


def fit(method: str, samples: Sequence[Sample], mode: str) -> GroupParams:
    if method == "logistic":
        return fit_logistic(samples, mode)
    if method == "weighted":
        return fit_weighted(samples, mode)
    return _params(weights=[])
