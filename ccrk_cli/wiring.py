"""What the packages below are handed when a ``ccrk`` command runs, here because only the top layer may
import them all: the indexer's builds get monitoring's quality gate (``indexer.quality_gate``), through the
command's context object (nothing global: a build called from Python passes its gate itself)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ccrk_settings import Settings
from indexer.quality_gate import QUALITY_GATE, Captioned, GateVerdict

if TYPE_CHECKING:
    from model.runtime import Encoder
    from store.version.manifest import IndexManifest


def monitoring_quality_gate(
    stage: Path, manifest: IndexManifest, encoder: Encoder, settings: Settings, captioned: Captioned
) -> GateVerdict | None:
    """``monitoring.gate.quality_gate``, imported on a build's first use: every other ``ccrk`` command
    would otherwise load the probe history's Redis client at start-up (some 60 ms)."""
    from monitoring.gate import quality_gate

    return quality_gate(stage, manifest, encoder, settings, captioned)


def context_object() -> dict[str, object]:
    """The ``ccrk`` command's context object: what its subcommands hand to the packages below."""
    return {QUALITY_GATE: monitoring_quality_gate}
