"""What the packages below are handed at start-up, here because only the top layer may import them all: the
indexer's builds run monitoring's quality gate (``indexer.quality_gate``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ccrk_settings import Settings
from indexer.quality_gate import Captioned, GateVerdict, install_quality_gate

if TYPE_CHECKING:
    from indexer.index_format import IndexManifest
    from model.runtime import Encoder


def monitoring_quality_gate(
    stage: Path, manifest: IndexManifest, encoder: Encoder, settings: Settings, captioned: Captioned
) -> GateVerdict | None:
    """``monitoring.gate.quality_gate``, imported on a build's first use: every other ``ccrk`` command
    would otherwise load the probe history's Redis client at start-up (some 60 ms)."""
    from monitoring.gate import quality_gate

    return quality_gate(stage, manifest, encoder, settings, captioned)


def wire() -> None:
    """Install what the ``ccrk`` command runs with (idempotent)."""
    install_quality_gate(monitoring_quality_gate)
