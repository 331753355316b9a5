"""How a fusion-encoder match score and the dual-encoder similarity combine into the re-ranking score.

The match head alone is a worse ranker than the dual encoder it re-ranks (measured on the demo model's test
split: mean IR R@1 over the top 16 fell from 87.0 to 83.8 % when ordering by the match margin alone), because
it was trained to tell a caption's image from a few sampled negatives, not to order a shortlist of near
misses. ALBEF and CCLM, whose evaluation CCRk follows, therefore rank the shortlist by the match score *plus*
the dual similarity. We add them in log-odds form: ``similarity / temperature`` is the dual encoder's
contrastive logit, ``match_margin = logit[match] - logit[no match]`` the fusion encoder's log-odds, so
neither scale swamps the other (same measurement: 87.0 -> 87.8 % R@1, best-worst language gap 4.0 -> 3.2).

numpy only, so the serving process (ONNX Runtime, no torch) shares it; torch tensors work too.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

ArrayT = TypeVar("ArrayT")


def rerank_scores(similarity: ArrayT, match_margin: ArrayT, temperature: float) -> ArrayT:
    """Re-ranking score of shortlisted pairs: dual logit plus match log-odds (higher is better).

    Args:
        similarity: cosine similarity of each (query, candidate) pair from the dual encoder.
        match_margin: ``Encoder.score_pairs`` output for the same pairs (match logit minus no-match logit).
        temperature: the model's contrastive temperature (``Encoder.temperature``), > 0.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return similarity / temperature + match_margin  # type: ignore[operator]


def rerank_order(similarity: np.ndarray, match_margin: np.ndarray, temperature: float) -> np.ndarray:
    """Indices that sort one shortlist by ``rerank_scores``, best first; ties keep the dual order."""
    return np.argsort(-rerank_scores(similarity, match_margin, temperature), kind="stable")
