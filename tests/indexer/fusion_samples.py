"""Candidate sets for the fusion tests (``test_fusion_fitting``, ``test_fusion_calibration``)."""

from __future__ import annotations

import numpy as np

from indexer.fusion_fitting import Sample
from store.products.hybrid import CHANNELS, FEATURES, Candidates


def candidates(features: np.ndarray) -> Candidates:
    """Candidates 0..n-1 with these features, in no channel's list, matched by no photo or text row."""
    n = features.shape[0]
    none = np.full(n, -1, np.int64)
    ranks = np.full((n, len(CHANNELS)), -1, np.int64)
    return Candidates(np.arange(n, dtype=np.int64), features.astype(np.float32), ranks, none, none, none)


def samples(rng: np.random.Generator, n: int = 60) -> list[Sample]:
    """Pseudo-queries whose relevant candidates have higher text and term-coverage features (and noise)."""
    out = []
    for _ in range(n):
        labels = np.zeros(12, bool)
        labels[rng.choice(12, size=2, replace=False)] = True
        x = rng.uniform(0.0, 0.5, size=(12, len(FEATURES)))
        x[labels, 1] += 0.3
        x[labels, 2] += 0.4
        x[labels, FEATURES.index("coverage")] += 0.4
        out.append(Sample("en", candidates(x), labels, 2))
    return out
