"""The quality gate injected into the builder: a gate passed to ``build`` judges it, one configured but not
wired in refuses (fails closed), and the ``ccrk`` command wires in monitoring's gate. The gate itself, on
real probes, is tested in tests/monitoring/test_gate.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import indexer.quality_gate as qg
from ccrk_settings import Settings
from indexer import index_format as fmt
from indexer.build import build
from indexer.index_format import IndexManifest
from indexer.quality_gate import Captioned, GateVerdict, resolve_gate, unwired_gate
from model.runtime import Encoder


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
    monkeypatch.setattr(qg, "_installed", FakeGate(GateVerdict(True, [], {})))  # the passed one wins
    refuse = FakeGate(GateVerdict(False, ["too few cats"], {"max_mrv": 1.0}, notes=["probed 3"]))
    refused = build("photos", [photo_folder], settings=settings, gate=refuse)
    assert refuse.judged == [(True, refused.version, 12)]  # the staged version, before install
    assert not refused.published and refused.gate == refuse.verdict.to_dict()
    note = f"quality gate refused version {refused.version}: it is kept, CURRENT is unchanged. too few cats"
    assert note in refused.notes and "probed 3" in refused.notes
    assert fmt.current_version(settings.index_root, "photos") is None
    assert fmt.version_refused(settings.index_root, "photos", refused.version)

    off = build("photos", [photo_folder], settings=settings, gate=FakeGate(None))  # None: no gate
    assert off.published and off.gate is None
    assert fmt.current_version(settings.index_root, "photos") == off.version


def test_a_configured_gate_not_wired_in_refuses(
    settings: Settings, photo_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(qg, "_installed", None)
    assert resolve_gate(None) is unwired_gate
    gated = settings.model_copy(update={"gate_max_mrv": 5.0})
    report = build("photos", [photo_folder], settings=gated)
    assert not report.published and report.gate is not None and not report.gate["passed"]
    assert "no quality gate is wired into this build" in report.gate["reasons"][0]
    assert report.gate["thresholds"]["max_mrv"] == 5.0
    assert fmt.current_version(settings.index_root, "photos") is None
    # No threshold: no gate, nothing to wire.
    assert unwired_gate(Path(), None, None, settings, []) is None  # type: ignore[arg-type]


def test_the_ccrk_command_wires_in_monitorings_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import monitoring.gate
    from ccrk_cli.main import app
    from ccrk_cli.wiring import monitoring_quality_gate

    monkeypatch.setattr(qg, "_installed", None)  # restored after the test
    assert resolve_gate(None) is unwired_gate  # importing the command wires nothing
    assert CliRunner().invoke(app, ["config", "show"]).exit_code == 0  # running a command does

    assert resolve_gate(None) is monitoring_quality_gate
    verdict = GateVerdict(True, [], {})
    seen = []

    def fake(*args: object) -> GateVerdict:
        seen.append(args)
        return verdict

    monkeypatch.setattr(monitoring.gate, "quality_gate", fake)
    args = (Path("stage"), "manifest", "encoder", "settings", [("a", {"en": ["cat"]})])
    assert monitoring_quality_gate(*args) is verdict and seen == [args]  # type: ignore[arg-type]
