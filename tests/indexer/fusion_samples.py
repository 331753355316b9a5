"""Candidate sets for the fusion tests (``test_fusion_fitting``, ``test_fusion_calibration``)."""

from __future__ import annotations

import numpy as np

from store.hybrid import CHANNELS, Candidates


def candidates(features: np.ndarray) -> Candidates:
    """Candidates 0..n-1 with these features, in no channel's list, matched by no photo or text row."""
    n = features.shape[0]
    none = np.full(n, -1, np.int64)
    ranks = np.full((n, len(CHANNELS)), -1, np.int64)
    return Candidates(np.arange(n, dtype=np.int64), features.astype(np.float32), ranks, none, none, none)
