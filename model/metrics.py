"""Retrieval metrics on rank tables.

A rank table is an (N, K) integer array: N instances (an image, or one aligned caption set), K languages,
each entry the 0-based rank of the correct item when querying in that language.

Two consistency figures are reported, TR and IR separately:

- ``mrv`` is CCRk's eq. 7, Mean Rank Variance: the mean over instances and languages of the squared
  deviation of a rank from that instance's mean rank, ``1/(N K) sum_i sum_k (r_ik - mean_k r_ik)^2``. It is
  in squared rank units, so one badly ranked language dominates it.
- ``mrv_std`` is what the authors' evaluation code prints: the mean over instances of the population
  standard deviation (ddof=0) of the K ranks, ``1/N sum_i std_k(r_ik)``, in rank units. Since the mean of
  square roots is at most the square root of the mean, ``mrv_std <= sqrt(mrv)``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def _check(ranks: npt.ArrayLike) -> np.ndarray:
    table = np.asarray(ranks)
    if table.ndim != 2:
        raise ValueError(f"ranks must be an (N, K) array of 0-based ranks, got shape {table.shape}")
    if table.size and (table < 0).any():
        raise ValueError("ranks must be 0-based (non-negative)")
    return table.astype(np.float64)


def recall_at_k(ranks: npt.ArrayLike, k: int) -> np.ndarray:
    """Per-language Recall@k: the share of instances whose rank is below ``k``; shape (K,)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    table = _check(ranks)
    return (table < k).mean(axis=0)


def mean_recall(ranks: npt.ArrayLike, ks: tuple[int, ...] = (1, 5, 10)) -> float:
    """Mean of Recall@k over the given ks and all languages."""
    return float(np.mean([recall_at_k(ranks, k).mean() for k in ks]))


def mrv(ranks: npt.ArrayLike) -> float:
    """Mean Rank Variance, CCRk eq. 7 (squared rank units)."""
    table = _check(ranks)
    deviation = table - table.mean(axis=1, keepdims=True)
    return float((deviation**2).mean())


def mrv_std(ranks: npt.ArrayLike) -> float:
    """Mean over instances of the population standard deviation of the K ranks (authors' code)."""
    table = _check(ranks)
    return float(table.std(axis=1, ddof=0).mean())


def ranks_from_scores(scores: np.ndarray, targets: npt.ArrayLike) -> np.ndarray:
    """0-based rank of ``targets[i]`` in row ``i`` of ``scores`` (higher is better; ties count against).

    ``targets`` may be (Q,) single targets or a (Q, T) array of several correct columns (-1 padded), in
    which case the best-ranked correct column counts.
    """
    scores = np.asarray(scores)
    target_cols = np.asarray(targets)
    if target_cols.ndim == 1:
        target_cols = target_cols[:, None]
    valid = target_cols >= 0
    safe = np.where(valid, target_cols, 0)
    target_scores = np.take_along_axis(scores, safe, axis=1)
    target_scores = np.where(valid, target_scores, -np.inf)
    best = target_scores.max(axis=1, keepdims=True)
    # Other columns scoring at least as high as the best target; the targets themselves don't count.
    above = (scores >= best).sum(axis=1)
    is_target = np.zeros_like(scores, dtype=bool)
    rows = np.arange(scores.shape[0])
    for col, ok in zip(safe.T, valid.T, strict=True):
        is_target[rows[ok], col[ok]] = True
    above_targets = ((scores >= best) & is_target).sum(axis=1)
    return (above - above_targets).astype(np.int64)
