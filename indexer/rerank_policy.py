"""How many candidates the fusion encoder re-ranks, per query: ``0`` when the dual encoder's answer is
already clear, a short head when the winner cannot lie deeper, all of them (``rerank_k``) otherwise. The
thresholds are calibrated on the built index itself and recorded in the version's manifest
(``manifest.rerank["policy"]``).

The rule. The re-rank score of a candidate is ``dual / temperature + match`` (``model.reranking``): a
candidate at dual rank ``p`` can only overtake the dual top hit when the fusion encoder's margin makes up
the cosine gap ``s[0] - s[p]``. So for each depth ``d`` of a short ladder (``DEPTHS``: 0, 16, 32) the
policy reads one gap, ``s[0] - s[max(d, 1)]``, and re-ranks ``d`` candidates when that gap is at least the
depth's calibrated ``min_gap``; the smallest such depth wins, and a query that clears none is re-ranked in
full. Depth 0 means the dual order is kept (the response is not re-ranked).

Calibration, with no relevance labels: caption queries of the collection (pseudo-queries, one caption each
of up to ``CALIBRATION_QUERIES`` items, two per item at most) are re-ranked in full; for each, the dual
rank of the full re-rank's winner is known, and depth ``d`` gives the same top result exactly when that
rank is below ``max(d, 1)``. Each depth's ``min_gap`` is the smallest gap above which at most
``DISAGREEMENT_BUDGET / len(DEPTHS)`` of the queries would get another top result than the full re-rank
(``measured``: the agreement with the full re-rank and the candidates scored per query, by two-fold
cross-validation). The budget is conservative for R@1: where a full re-rank changes the top result, it is
not always to the right one (on the demo catalogue, seed 7, the full re-rank's R@1 was below the dual
encoder's). A version without captions, or a model without a fusion encoder, gets no policy, and the
service then re-ranks in full.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from model.reranking import MATCH_OUTPUT, RerankScore, rerank_scores
from model.runtime import Encoder
from store.version.reader import SearchableIndex

DEPTHS: tuple[int, ...] = (0, 16, 32)  # the ladder below a full re-rank (``rerank_k``, 128 by default)
CALIBRATION_K = 128  # candidates re-ranked in full while calibrating (the service's default rerank_k)
CALIBRATION_QUERIES = 300  # caption queries re-ranked in full (demo model: ~13 CPU-seconds of a build)
QUERIES_PER_ITEM = 2  # and at most this many per live item (a small collection's build stays quick)
# At most this share of calibration queries may get another top result than a full re-rank, shared equally
# between the depths: the target is at most 0.5 points of R@1 lost, and half of it is kept as margin.
DISAGREEMENT_BUDGET = 0.0025


@dataclass(frozen=True)
class RerankPolicy:
    """Per depth of ``depths`` (ascending), the dual-score gap at or above which that depth suffices;
    None: never (the calibration found no safe gap)."""

    depths: tuple[int, ...]
    min_gaps: tuple[float | None, ...]
    score: str = "dual_plus_margin"  # the re-rank score it was calibrated for
    measured: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if len(self.depths) != len(self.min_gaps):
            raise ValueError("a policy needs one min_gap per depth")
        if list(self.depths) != sorted(set(self.depths)) or (self.depths and self.depths[0] < 0):
            raise ValueError(f"depths must be distinct, ascending and >= 0; got {self.depths}")

    def depth(self, scores: np.ndarray, rerank_k: int) -> int:
        """Candidates to re-rank for one shortlist whose dual scores ``scores`` are in descending order: the
        first depth whose gap is cleared, at most ``rerank_k`` and the shortlist (a full re-rank when no
        depth's gap is cleared). A depth that covers the whole head needs no gap: 0 for a head of one."""
        full = min(rerank_k, int(scores.size))
        for depth, min_gap in zip(self.depths, self.min_gaps, strict=True):
            pos = max(depth, 1)
            if pos >= full:
                return min(depth, full)
            if min_gap is not None and float(scores[0] - scores[pos]) >= min_gap:
                return depth
        return full

    def to_dict(self) -> dict[str, Any]:
        return {
            "depths": list(self.depths),
            "min_gaps": list(self.min_gaps),
            "score": self.score,
            "measured": self.measured,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RerankPolicy:
        gaps = tuple(None if g is None else float(g) for g in data["min_gaps"])
        return cls(
            tuple(int(d) for d in data["depths"]),
            gaps,
            str(data.get("score", "dual_plus_margin")),
            dict(data.get("measured", {})),
        )


def winner_ranks(combined: np.ndarray) -> np.ndarray:
    """(n,) dual rank of each query's full re-rank winner: the first maximum of its re-rank scores
    (``combined``, (n, K) in dual order; NaN where a shortlist is shorter)."""
    filled = np.where(np.isnan(combined), -np.inf, combined)
    return np.argmax(filled, axis=1)


def depth_gaps(scores: np.ndarray, depth: int) -> np.ndarray:
    """(n,) ``s[0] - s[max(depth, 1)]`` per shortlist (dual scores (n, K), descending); +inf where the
    shortlist holds no candidate at that position (the depth covers all of it)."""
    pos = max(depth, 1)
    if pos >= scores.shape[1]:
        return np.full(scores.shape[0], np.inf)
    gaps = (scores[:, 0] - scores[:, pos]).astype(np.float64)
    return np.where(np.isnan(gaps), np.inf, gaps)


def fit_min_gap(gaps: np.ndarray, wrong: np.ndarray, allowed: int) -> float:
    """The smallest gap threshold ``t`` with at most ``allowed`` of the ``wrong`` queries at ``gap >= t``
    (0.0 when they are that few anyway)."""
    bad = np.sort(gaps[wrong])[::-1]
    if bad.size <= allowed:
        return 0.0
    return float(np.nextafter(bad[allowed], np.inf))


def fit(scores: np.ndarray, winners: np.ndarray, budget: float = DISAGREEMENT_BUDGET) -> RerankPolicy:
    """A policy from calibration shortlists: dual scores (n, K, descending) and the dual rank of each full
    re-rank's winner (``winner_ranks``)."""
    allowed = math.floor(budget / len(DEPTHS) * scores.shape[0] + 1e-9)
    gaps = []
    for depth in DEPTHS:
        wrong = winners >= max(depth, 1)
        gaps.append(_round_up(fit_min_gap(depth_gaps(scores, depth), wrong, allowed)))
    return RerankPolicy(DEPTHS, tuple(gaps))


def _round_up(x: float) -> float | None:
    """A threshold rounded up to 6 decimals (JSON-friendly and never looser); None for infinity."""
    return None if not math.isfinite(x) else math.ceil(x * 1e6) / 1e6


def measure(policy: RerankPolicy, scores: np.ndarray, winners: np.ndarray, k: int) -> dict[str, Any]:
    """Agreement of the policy's top result with the full re-rank's, and candidates scored per query."""
    depths = np.array([policy.depth(row[np.isfinite(row)], k) for row in scores])
    agree = winners < np.maximum(depths, 1)
    return {
        "queries": int(scores.shape[0]),
        "top1_agreement": round(float(agree.mean()), 4) if agree.size else None,
        "mean_candidates": round(float(depths.mean()), 2) if depths.size else None,
        "full_candidates": k,
        "share_by_depth": {
            str(d): round(float(np.mean(depths == d)), 4) for d in sorted({*policy.depths, k})
        },
    }


def calibrate(
    scores: np.ndarray, combined: np.ndarray, seed: int = 0, score: str = "dual_plus_margin"
) -> RerankPolicy:
    """Fit on all calibration shortlists; ``measured`` by two-fold cross-validation (each half fits a
    policy that the other half measures; the counts summed over both)."""
    winners = winner_ranks(combined)
    policy = fit(scores, winners)
    order = np.random.default_rng(seed).permutation(scores.shape[0])
    halves = (order[: (order.size + 1) // 2], order[(order.size + 1) // 2 :])
    k = scores.shape[1]
    agree, candidates, held = 0.0, 0.0, 0
    for fit_rows, held_rows in (halves, halves[::-1]):
        if not fit_rows.size or not held_rows.size:
            continue
        half = measure(fit(scores[fit_rows], winners[fit_rows]), scores[held_rows], winners[held_rows], k)
        agree += half["top1_agreement"] * half["queries"]
        candidates += half["mean_candidates"] * half["queries"]
        held += half["queries"]
    measured: dict[str, Any] = {"queries": int(scores.shape[0]), "full_candidates": k}
    if held:
        measured |= {
            "cv_top1_agreement": round(agree / held, 4),
            "cv_mean_candidates": round(candidates / held, 2),
        }
    measured["share_by_depth"] = measure(policy, scores, winners, k)["share_by_depth"]
    return RerankPolicy(policy.depths, policy.min_gaps, score, measured)


def full_reranks(
    index: SearchableIndex,
    encoder: Encoder,
    texts: Sequence[str],
    k: int = CALIBRATION_K,
    score: RerankScore = "dual_plus_margin",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each query's dual shortlist of ``k`` as the service searches it, and its full re-rank: dual scores
    (n, k), rows (n, k) and re-rank scores (n, k), NaN / -1 past a shorter shortlist."""
    n = len(texts)
    scores = np.full((n, k), np.nan, np.float32)
    rows = np.full((n, k), -1, np.int64)
    combined = np.full((n, k), np.nan, np.float32)
    output = MATCH_OUTPUT[score]
    for start in range(0, n, 64):
        encoded = encoder.encode_text(list(texts[start : start + 64]))
        found_scores, found_rows = index.search(encoded.embeds, k)
        for j in range(found_rows.shape[0]):
            keep = found_rows[j] >= 0
            got_rows, got_scores = found_rows[j][keep], found_scores[j][keep]
            if not got_rows.size:
                continue
            i, m = start + j, got_rows.size
            match = encoder.score_pairs(encoded.row(j), index.rerank_tokens(got_rows), output)
            scores[i, :m], rows[i, :m] = got_scores, got_rows
            combined[i, :m] = rerank_scores(got_scores, match.astype(np.float32), encoder.temperature, score)
    return scores, rows, combined


def calibration_texts(
    captions: Mapping[str, Sequence[str]], seed: int = 0, queries: int = CALIBRATION_QUERIES
) -> list[str]:
    """Up to ``queries`` caption queries, spread over the languages."""
    rng = np.random.default_rng(seed)
    pool = [(lang, text) for lang in sorted(captions) for text in captions[lang]]
    picked = rng.permutation(len(pool))[:queries]
    return [pool[int(i)][1] for i in picked]


def calibrate_version(
    index: SearchableIndex,
    encoder: Encoder,
    captions: Mapping[str, Sequence[str]],
    seed: int = 0,
    queries: int = CALIBRATION_QUERIES,
) -> RerankPolicy | None:
    """The policy of an opened version from up to ``queries`` of its captions
    (``CCRK_RERANK_POLICY_QUERIES``); None without captions (or ``queries`` 0), a fusion encoder or a
    re-rank store."""
    if not encoder.capabilities.rerank:
        return None
    texts = calibration_texts(captions, seed, queries)[: QUERIES_PER_ITEM * len(index)]
    if len(texts) < 8:
        return None
    scores, _, combined = full_reranks(index, encoder, texts, k=max(1, min(CALIBRATION_K, len(index))))
    return calibrate(scores, combined, seed)
