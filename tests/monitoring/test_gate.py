"""The quality gate: threshold checks by hand, then real builds where a deliberately degraded version
(every caption pointing at another item's image) is built and kept but not published."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ccrk_cli.main import app as ccrk_app
from ccrk_settings import DEFAULT_MODEL_DIR, Settings, get_settings
from indexer.build import build
from model.runtime import Encoder
from monitoring.gate import GateThresholds, evaluate_gate, quality_gate
from monitoring.history import SqliteHistory
from monitoring.probe import has_text_channels, index_searcher, run_probes
from monitoring.probe_set import probes_from_captions
from store.layout import MANIFEST_FILE
from store.opening import open_version
from store.products.hybrid import OTHER, HybridQuery, gather, rrf
from store.text.lexical import analyze
from store.verify import verify_version
from store.version.manifest import IndexManifest
from store.version.versions import current_version, list_versions
from tests.fixtures import Catalogue


def run(per_language: dict[str, float], mrv: float = 1.0) -> dict[str, object]:
    return {"per_language": {k: {"recall_at_10": v} for k, v in per_language.items()}, "mrv": mrv}


def test_thresholds_by_hand() -> None:
    off = GateThresholds()
    assert not off.enabled and evaluate_gate(run({"en": 0.0}, 99.0), None, off).passed
    rules = GateThresholds(min_recall_at_10=0.5, max_mrv=10.0, max_recall_drop=0.1)
    ok = evaluate_gate(run({"en": 0.9, "ja": 0.5}, 10.0), run({"en": 0.95, "ja": 0.6}), rules)
    assert ok.passed and ok.reasons == []  # 0.5 meets the minimum, a 0.1 drop is allowed
    bad = evaluate_gate(
        run({"en": 0.9, "ja": 0.45}, 12.5), run({"en": 0.95, "ja": 0.7}), rules, baseline_version="v1"
    )
    assert not bad.passed
    assert bad.reasons == [
        "ja: recall@10 0.450 is below the minimum 0.500",
        "MRV 12.50 is above the ceiling 10.00",
        "ja: recall@10 fell 25.0 points against v1 (0.700 -> 0.450), more than 10.0",
    ]


def write_catalogue(catalogue: Catalogue, path: Path, *, shift: int) -> Path:
    """The catalogue as jsonl; ``shift`` > 0 gives each record the image of the record ``shift`` after it."""
    records = catalogue.records
    with open(path, "w", encoding="utf-8") as fh:
        for i, r in enumerate(records):
            image = records[(i + shift) % len(records)].image
            fh.write(json.dumps({"id": r.id, "image": str(image), "captions": r.captions}) + "\n")
    return path


def gate_settings(tmp_path: Path) -> Settings:
    return Settings(
        model_dir=DEFAULT_MODEL_DIR,
        backend="onnx",
        device="cpu",
        threads=1,
        index_root=tmp_path / "indexes",
        index_workers=0,
        index_batch_size=32,
        shard_size=64,
        redis_url=None,
        history_db=tmp_path / "history.sqlite",
        gate_min_recall_at_10=0.5,
        gate_max_recall_drop=0.2,
        gate_probe_size=30,
        probe_depth=20,
    )


def test_gate_refuses_a_degraded_index(
    catalogue: Catalogue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = gate_settings(tmp_path)
    good = build(
        "shop",
        [write_catalogue(catalogue, tmp_path / "good.jsonl", shift=0)],
        settings=settings,
        gate=quality_gate,
    )
    assert good.published and good.gate is not None and good.gate["passed"], good.notes
    assert current_version(settings.index_root, "shop") == good.version

    bad = build(
        "shop",
        [write_catalogue(catalogue, tmp_path / "bad.jsonl", shift=7)],
        settings=settings,
        gate=quality_gate,
    )
    assert not bad.published and bad.gate is not None and not bad.gate["passed"]
    # Built and kept, not promoted: CURRENT still names the good version.
    assert current_version(settings.index_root, "shop") == good.version
    assert list_versions(settings.index_root, "shop") == [good.version, bad.version]
    assert verify_version(settings.index_root, "shop", bad.version) == []
    reasons = bad.gate["reasons"]
    assert any("below the minimum 0.500" in r for r in reasons)
    assert any("fell" in r and good.version in r for r in reasons)
    assert any("quality gate refused version " + bad.version in n for n in bad.notes)
    manifest = IndexManifest.load(settings.index_root / "shop" / bad.version / MANIFEST_FILE)
    assert manifest.build_params["quality_gate"]["passed"] is False

    # Both verdicts are in the history, where the dashboard shows them.
    runs = SqliteHistory(settings.history_db, 86400).runs(0)
    assert [(r["index_version"], r["gate"]["passed"]) for r in runs] == [
        (good.version, True),
        (bad.version, False),
    ]
    assert (
        runs[1]["per_language"]["en"]["recall_at_10"] < 0.5 <= runs[0]["per_language"]["en"]["recall_at_10"]
    )

    # The CLI says why and exits 1; CURRENT is unchanged.
    for key, value in {
        "CCRK_INDEX_ROOT": str(settings.index_root),
        "CCRK_MODEL_DIR": str(DEFAULT_MODEL_DIR),
        "CCRK_BACKEND": "onnx",
        "CCRK_THREADS": "1",
        "CCRK_INDEX_WORKERS": "0",
        "CCRK_HISTORY_DB": str(settings.history_db),
        "CCRK_GATE_MAX_RECALL_DROP": "0.2",
        "CCRK_GATE_PROBE_SIZE": "30",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CCRK_REDIS_URL", raising=False)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(
            ccrk_app, ["index", "build", "--name", "shop", str(tmp_path / "bad.jsonl")]
        )
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 1, result.output
    assert "quality gate refused" in " ".join(result.output.split())
    assert current_version(settings.index_root, "shop") == good.version


def test_gate_without_probes_refuses(catalogue: Catalogue, tmp_path: Path) -> None:
    """Fail closed: thresholds set, no probe set and a source without captions."""
    settings = gate_settings(tmp_path)
    manifest = tmp_path / "items.jsonl"
    manifest.write_text(
        "".join(json.dumps({"id": r.id, "path": str(r.image)}) + "\n" for r in catalogue.records[:10])
    )
    report = build("plain", [manifest], settings=settings, gate=quality_gate)
    assert not report.published and current_version(settings.index_root, "plain") is None
    assert "no probes" in report.gate["reasons"][0]


def test_gate_probes_a_product_version_in_hybrid_mode(
    catalogue: Catalogue, tmp_path: Path, encoder: Encoder
) -> None:
    """A version with searched text fields is probed as shoppers search it by default (hybrid): the
    history's gate run holds exactly what hybrid probes measure on it, and says which mode it was."""
    settings = gate_settings(tmp_path).model_copy(
        update={"text_fields": ["title"], "gate_max_recall_drop": None}
    )
    records = catalogue.records[:40]
    manifest = tmp_path / "products.jsonl"
    manifest.write_text(
        "".join(
            json.dumps(
                {"id": r.id, "image": str(r.image), "title": r.captions["de"][0], "captions": r.captions}
            )
            + "\n"
            for r in records
        ),
        encoding="utf-8",
    )
    report = build("products", [manifest], settings=settings, gate=quality_gate)
    assert report.gate is not None and report.published, report.gate
    assert "the gate probed the version's default mode, hybrid" in report.gate["notes"]
    (run_,) = SqliteHistory(settings.history_db, 86400).runs(0)
    assert run_["mode"] == "hybrid" and run_["index_version"] == report.version
    probes = probes_from_captions([(r.id, r.captions) for r in records], n=settings.gate_probe_size, seed=0)
    with open_version(settings.index_root, "products", report.version) as version:
        assert has_text_channels(version)
        want = run_probes(probes, index_searcher(version, encoder, mode="hybrid"), depth=settings.probe_depth)
        # A stored fusion that cannot be parsed: probed as the service ranks it, by reciprocal rank.
        channels = version.products
        channels.info.fusion = {**channels.info.fusion, "hybrid": ["not", "a", "table"]}
        text = records[0].captions["en"][0]
        got = index_searcher(version, encoder, mode="hybrid")("en", text, 10)
        embed = encoder.encode_text([text], languages=["en"]).embeds[0]
        cands = gather(channels, HybridQuery(embed, analyze(text, "en"), OTHER), 10, version.live_mask())
        order = np.argsort(-rrf(cands, "hybrid"), kind="stable")[:10]
        assert got.ids == [item["id"] for item in version.items([int(cands.rows[i]) for i in order])]
        channels.info.fusion = {}  # nothing calibrated: searched (and probed) by reciprocal rank too
        assert has_text_channels(version)
        assert index_searcher(version, encoder, mode="hybrid")("en", text, 10).ids == got.ids
    assert run_["mrv"] == want["mrv"] and run_["per_language"].keys() == want["per_language"].keys()
    for lang, measured in want["per_language"].items():
        quality = {k: v for k, v in measured.items() if not k.startswith("latency")}
        assert {k: run_["per_language"][lang][k] for k in quality} == quality, lang
