"""The quality gate injected into the builder: a gate passed to ``build`` judges it, one configured but not
wired in refuses (fails closed), and the ``ccrk`` command wires in monitoring's gate. The gate itself, on
real probes, is tested in tests/monitoring/test_gate.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccrk_settings import Settings, get_settings
from indexer.build import build
from indexer.quality_gate import Captioned, GateVerdict, resolve_gate, unwired_gate
from model.runtime import Encoder
from store.version.manifest import IndexManifest
from store.version.versions import current_version, version_refused


class FakeGate:
    """Returns a fixed verdict and remembers what it was asked to judge."""

    def __init__(self, verdict: GateVerdict | None) -> None:
        self.verdict, self.judged = verdict, []

    def __call__(
        self, stage: Path, manifest: IndexManifest, encoder: Encoder, settings: Settings, captioned: Captioned
    ) -> GateVerdict | None:
        self.judged.append((stage.is_dir(), manifest.version, manifest.count))
        return self.verdict


def test_an_injected_gate_decides_the_publish(
    settings: Settings, photo_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refuse = FakeGate(GateVerdict(False, ["too few cats"], {"max_mrv": 1.0}, notes=["probed 3"]))
    refused = build("photos", [photo_folder], settings=settings, gate=refuse)
    assert refuse.judged == [(True, refused.version, 12)]  # the staged version, before install
    assert not refused.published and refused.gate == refuse.verdict.to_dict()
    note = f"quality gate refused version {refused.version}: it is kept, CURRENT is unchanged. too few cats"
    assert note in refused.notes and "probed 3" in refused.notes
    assert current_version(settings.index_root, "photos") is None
    assert version_refused(settings.index_root, "photos", refused.version)

    off = build("photos", [photo_folder], settings=settings, gate=FakeGate(None))  # None: no gate
    assert off.published and off.gate is None
    assert current_version(settings.index_root, "photos") == off.version


def test_a_configured_gate_not_wired_in_refuses(
    settings: Settings, photo_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_gate(None) is unwired_gate
    gated = settings.model_copy(update={"gate_max_mrv": 5.0})
    report = build("photos", [photo_folder], settings=gated)
    assert not report.published and report.gate is not None and not report.gate["passed"]
    assert "no quality gate is wired into this build" in report.gate["reasons"][0]
    assert report.gate["thresholds"]["max_mrv"] == 5.0
    assert current_version(settings.index_root, "photos") is None
    # No threshold: no gate, nothing to wire.
    assert unwired_gate(Path(), None, None, settings, []) is None  # type: ignore[arg-type]


def test_the_ccrk_command_hands_monitorings_gate_to_builds(
    settings: Settings, photo_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ccrk index build` runs monitoring's gate (through the command's context, nothing global): a
    configured gate refuses, the command exits 1; a build called from Python without a gate is unwired."""
    from typer.testing import CliRunner

    import monitoring.gate
    from ccrk_cli.main import app

    seen = []

    def fake(*args: object) -> GateVerdict:
        seen.append(args)
        return GateVerdict(False, ["fake probe says no"], {"max_mrv": 5.0})

    monkeypatch.setattr(monitoring.gate, "quality_gate", fake)
    monkeypatch.setenv("CCRK_GATE_MAX_MRV", "5")
    monkeypatch.setenv("CCRK_MODEL_DIR", str(settings.model_dir))
    monkeypatch.setenv("CCRK_INDEX_WORKERS", "0")
    root = settings.index_root
    # The command reads the environment once per process (get_settings is cached): read it afresh here,
    # and again after the test, when these variables are gone.
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(
            app, ["index", "build", "--name", "g", "--index-root", str(root), str(photo_folder)]
        )
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 1, result.output
    assert len(seen) == 1 and "fake probe says no" in " ".join(result.output.split())
    assert current_version(root, "g") is None
    # Importing and running the command left nothing behind for builds called from Python.
    gated = settings.model_copy(update={"gate_max_mrv": 5.0})
    report = build("p", [photo_folder], settings=gated)
    assert "no quality gate is wired into this build" in report.gate["reasons"][0] and len(seen) == 1
