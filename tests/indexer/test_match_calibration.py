"""Match calibration: thresholds from known score distributions (exact quantiles), per-script noise, the
no-caption fallback, the manifest round trip; and a real build records one that separates captions from
noise."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from ccrk_settings import Settings
from indexer.build import build
from indexer.match_calibration import MatchCalibration, MatchThresholds, calibrate
from indexer.ood_queries import kinds_for_language, ood_queries
from store.version.reader import IndexVersion


def fake_scores(table: dict[str, float], seed: int, noise: float = 0.5) -> Callable:
    """A top-1 function: captions score from ``table``, the i-th noise query (of ``seed``) 0.5 + i / 1000."""
    noise_texts = {text: i for i, (_, text) in enumerate(ood_queries(seed=seed))}

    def top_scores(texts: Sequence[str]) -> np.ndarray:
        return np.array([table.get(t, noise + 0.001 * noise_texts.get(t, 0)) for t in texts])

    return top_scores


def test_thresholds_are_the_stated_quantiles() -> None:
    captions = {"en": [f"caption {i}" for i in range(40)]}
    table = {f"caption {i}": 0.80 + 0.005 * i for i in range(40)}
    cal = calibrate(fake_scores(table, seed=3), captions, languages=("en", "ja"), seed=3)
    en, ja = cal.thresholds("en"), cal.thresholds("ja")
    # strong_from: the 10th percentile of the fitting half of the caption scores (20 of the 40).
    fitted = sorted(table.values())
    assert fitted[0] <= en.strong_from <= fitted[-1]
    assert en.none_below <= en.strong_from
    # Noise: its own script's queries only (Latin for en, Han/kana for ja), 95th percentile.
    noise = ood_queries(seed=3)
    latin = [0.5 + 0.001 * i for i, (k, _) in enumerate(noise) if k in kinds_for_language("en")]
    cjk = [0.5 + 0.001 * i for i, (k, _) in enumerate(noise) if k in kinds_for_language("ja")]
    assert min(latin) <= en.none_below <= max(latin)
    assert min(cjk) <= ja.none_below <= max(cjk)
    assert ja.strong_from >= ja.none_below  # no captions in ja: strong is above its noise
    row = cal.measured["per_language"]["en"]
    assert row["caption_queries"] == 20 and row["caption_none_rate"] == 0.0
    assert cal.source == "captions+ood" and cal.thresholds("xx") == cal.default
    assert MatchCalibration.from_dict(cal.to_dict()) == cal


def test_without_captions_strong_means_above_all_noise() -> None:
    cal = calibrate(fake_scores({}, seed=0), {}, languages=("en",), seed=0)
    assert cal.source == "ood" and cal.measured["ood_none_rate"] > 0.8
    en = cal.thresholds("en")
    assert en.none_below < en.strong_from
    assert MatchThresholds(0.5, 0.8).label(0.49) == "none"
    assert MatchThresholds(0.5, 0.8).label(0.5) == "weak"
    assert MatchThresholds(0.5, 0.8).label(0.8) == "strong"


@pytest.mark.parametrize(
    "recorded",
    [
        {"per_language": {}},  # no default
        {"default": [0.5, 0.8]},
        {"default": {"none_below": 0.5}},
        {"default": {"none_below": "0.5", "strong_from": 0.8}},
        {"default": {"none_below": float("nan"), "strong_from": 0.8}},
        {"default": {"none_below": True, "strong_from": 0.8}},
        {"default": {"none_below": 10**400, "strong_from": 0.8}},  # JSON reads it as an int no float holds
        {"default": {"none_below": 0.5, "strong_from": 0.8}, "per_language": ["en"]},
        {"default": {"none_below": 0.5, "strong_from": 0.8}, "per_language": {"en": 0.5}},
        {"default": {"none_below": 0.5, "strong_from": 0.8}, "measured": "ab"},
        ["default"],
        "calibrated",
    ],
)
def test_a_malformed_calibration_is_refused_when_read(recorded: object) -> None:
    """A hand-edited calibration is refused with ValueError when read, not served with thresholds that fail
    (or mislabel) every search later."""
    with pytest.raises(ValueError, match=r"match calibration|match thresholds"):
        MatchCalibration.from_dict(recorded)  # type: ignore[arg-type]


@pytest.mark.parametrize("lang", ["ja", "zh", "ko", "ru", "ar", "hi", "el", "de"])
def test_every_script_has_its_own_noise(lang: str) -> None:
    kinds = [k for k, _ in ood_queries()]
    assert sum(k in kinds_for_language(lang) for k in kinds) >= 16, lang


def test_a_build_records_a_calibration_that_separates_captions_from_noise(
    settings: Settings, catalogue: Path
) -> None:
    report = build("cal", [catalogue / "test.jsonl"], settings=settings)
    assert report.published
    with IndexVersion.open(settings.index_root, "cal") as idx:
        cal = MatchCalibration.from_dict(idx.manifest.match_calibration)
    assert cal.source == "captions+ood" and set(cal.per_language) >= {"en", "de", "ja", "zh"}
    for lang, row in cal.measured["per_language"].items():
        # 40 items, so few held-out captions per language: whole-caption queries are never "none" and
        # most are strong; hardly any noise query is strong.
        assert row["caption_none_rate"] == 0.0, lang
        assert row["caption_strong_rate"] >= 0.6, (lang, row)
        assert row["ood_not_strong_rate"] >= 0.95, (lang, row)
