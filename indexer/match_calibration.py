"""How good a match is: per-language thresholds on the top result's cosine similarity, calibrated on the
built index itself against in-domain queries (the collection's own captions) and queries that match
nothing (``indexer.ood_queries``), and recorded in the version's manifest.

A result's label: ``strong`` at or above ``strong_from``, ``none`` below ``none_below``, ``weak`` between.
A query's label is its top result's. Measured on the demo catalogue (1,000 items, demo model): the top-1
cosine of caption queries and of queries matching nothing separates completely (AUROC 1.0; the gaps between
the first results and z-scores over the top 50 separate far worse, AUROC 0.64 and 0.58), but short in-domain
queries ("赤いカップ") reach only 0.80-0.90, inside the noise range: labels only, so nothing is dropped by
default (``bench/match_quality.py``).

Thresholds, per language L with captions: ``strong_from[L]`` = the 10th percentile of L's caption
queries' top-1 scores (90 % of full in-domain queries are strong); ``none_below`` = the 95th percentile of
the no-match queries' top-1 scores in L's script, but never above ``strong_from[L]``. Without captions (a
folder of photos) only the no-match side is known: ``none_below`` = its 95th percentile, ``strong_from`` = its
maximum (a result above every noise query). Half of each query set fits, the other half measures
(``measured``: the share of held-out caption queries labelled strong and none, of no-match queries labelled
none and not strong).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from indexer.ood_queries import kinds_for_language, ood_queries
from model.runtime import Encoder
from store.products.hybrid import is_finite_number
from store.version.reader import SearchableIndex

MatchLabel = Literal["strong", "weak", "none"]
CAPTIONS_PER_LANGUAGE = 200
RECALIBRATE_MIN_CAPTIONED = 200  # an ``add`` recalibrates only when it brings this many captioned items
IN_DOMAIN_STRONG_QUANTILE = 0.10
OOD_NONE_QUANTILE = 0.95
MIN_OWN_NOISE = 8  # no-match queries of a language's own script needed to calibrate on them alone

TopScores = Callable[[Sequence[str]], np.ndarray]  # queries -> (n,) top-1 cosine similarity


@dataclass(frozen=True)
class MatchThresholds:
    none_below: float
    strong_from: float

    def label(self, score: float) -> MatchLabel:
        if score >= self.strong_from:
            return "strong"
        return "none" if score < self.none_below else "weak"

    @classmethod
    def from_dict(cls, data: object) -> MatchThresholds:
        """ValueError unless ``data`` holds both thresholds as finite numbers: anything else (a hand-edited
        manifest) would fail, or mislabel, every search compared with it."""
        if isinstance(data, Mapping):
            values = (data.get("none_below"), data.get("strong_from"))
            if all(is_finite_number(v) for v in values):
                return cls(float(values[0]), float(values[1]))
        raise ValueError(f"not match thresholds: {data!r:.80}")


@dataclass
class MatchCalibration:
    """Thresholds per language (``default`` for languages without captions, and unsupported ones)."""

    default: MatchThresholds
    per_language: dict[str, MatchThresholds] = field(default_factory=dict)
    source: str = "captions+ood"  # or "ood" (no captions in the collection)
    measured: dict[str, Any] = field(default_factory=dict)

    def thresholds(self, lang: str | None) -> MatchThresholds:
        return self.per_language.get(lang or "", self.default)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MatchCalibration:
        """The calibration ``to_dict`` wrote; ValueError when ``data`` is not one (as ``MatchThresholds``)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"not a match calibration: {data!r:.80}")
        per_language, measured = data.get("per_language", {}), data.get("measured", {})
        if not isinstance(per_language, Mapping) or not isinstance(measured, Mapping):
            raise ValueError("not a match calibration: per_language and measured must be objects")
        return cls(
            default=MatchThresholds.from_dict(data.get("default")),
            per_language={str(k): MatchThresholds.from_dict(v) for k, v in per_language.items()},
            source=str(data.get("source", "captions+ood")),
            measured=dict(measured),
        )


def _halves(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    order = rng.permutation(n)
    return order[: (n + 1) // 2], order[(n + 1) // 2 :]


def _r(x: float) -> float:
    return round(float(x), 4)


def calibrate(
    top_scores: TopScores,
    captions: Mapping[str, Sequence[str]],
    languages: Sequence[str] = (),
    seed: int = 0,
) -> MatchCalibration:
    """Thresholds from the index's answers to caption queries per language and to no-match queries.

    Args:
        top_scores: the index's top-1 cosine for each query (encoded as the service encodes queries).
        captions: in-domain queries per language (may be empty: a collection without captions).
        languages: the model's languages (thresholds for each, captions or not).
        seed: sampling and fit/measure split.
    """
    rng = np.random.default_rng(seed)
    noise_queries = ood_queries(seed=seed)
    kinds = np.array([kind for kind, _ in noise_queries])
    noise = top_scores([text for _, text in noise_queries])
    if not np.isfinite(noise).all():  # an empty version (everything deleted) answers nothing
        empty = MatchThresholds(1.0, 1.0)
        return MatchCalibration(empty, {}, "empty", {"ood_queries": len(noise)})
    is_fit = np.zeros(len(noise), dtype=bool)
    is_fit[_halves(len(noise), rng)[0]] = True
    usable = {lang: list(texts) for lang, texts in captions.items() if len(texts) >= 4}
    default_none = float(np.quantile(noise[is_fit], OOD_NONE_QUANTILE))
    per_language: dict[str, MatchThresholds] = {}
    measured: dict[str, Any] = {"ood_queries": len(noise), "per_language": {}}
    strongs: list[float] = []
    for lang in sorted(set(languages) | set(usable)):
        own = np.isin(kinds, sorted(kinds_for_language(lang)))
        fit, held = own & is_fit, own & ~is_fit
        if fit.sum() < MIN_OWN_NOISE:  # too little noise in its script: all of it
            fit, held = is_fit, ~is_fit
        none_below = float(np.quantile(noise[fit], OOD_NONE_QUANTILE))
        row: dict[str, Any] = {"ood_queries": int(held.sum())}
        if lang in usable:
            picked = [usable[lang][i] for i in rng.permutation(len(usable[lang]))[:CAPTIONS_PER_LANGUAGE]]
            scores = top_scores(picked)
            scores = scores[np.isfinite(scores)]
            lang_fit, lang_held = _halves(len(scores), rng)
            strong = float(np.quantile(scores[lang_fit], IN_DOMAIN_STRONG_QUANTILE))
            none_below = min(none_below, strong)
            strongs.append(strong)
            held_scores = scores[lang_held]
            row |= {
                "caption_queries": int(held_scores.size),
                "caption_strong_rate": _r(np.mean(held_scores >= strong)),
                "caption_none_rate": _r(np.mean(held_scores < none_below)),
            }
        else:  # nothing in-domain to go by: strong means above every noise query of its script
            strong = max(none_below, float(np.max(noise[fit])))
        per_language[lang] = MatchThresholds(_r(none_below), _r(strong))
        row |= {
            "ood_none_rate": _r(np.mean(noise[held] < none_below)),
            "ood_not_strong_rate": _r(np.mean(noise[held] < strong)),
        }
        measured["per_language"][lang] = row
    default_strong = min(strongs) if strongs else float(np.max(noise[is_fit]))
    default = MatchThresholds(_r(default_none), _r(max(default_none, default_strong)))
    measured["ood_none_rate"] = _r(np.mean(noise[~is_fit] < default.none_below))
    return MatchCalibration(default, per_language, "captions+ood" if usable else "ood", measured)


def index_top_scores(index: SearchableIndex, encoder: Encoder, batch: int = 64) -> TopScores:
    """The version's top-1 score for each query, searched as the service searches (tuned parameters)."""

    def top_scores(texts: Sequence[str]) -> np.ndarray:
        out = []
        for start in range(0, len(texts), batch):
            embeds = encoder.encode_text(list(texts[start : start + batch])).embeds
            scores, _ = index.search(embeds, 1)
            out.append(scores[:, 0])
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    return top_scores


def calibrate_version(
    index: SearchableIndex, encoder: Encoder, captions: Mapping[str, Sequence[str]], seed: int = 0
) -> MatchCalibration:
    """``calibrate`` on an opened version, for the encoder's languages."""
    return calibrate(index_top_scores(index, encoder), captions, tuple(encoder.config.languages), seed)
