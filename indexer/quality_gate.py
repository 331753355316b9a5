"""The quality gate as the builder sees it: the thresholds that switch it on, the verdict it acts on, and the
``QualityGate`` it is handed.

The gate itself (``monitoring.gate.quality_gate``) probes the staged version and records the run in the
probe history, both monitoring's, and monitoring sits above the indexer: the indexer never imports it.
Instead a gate is injected: passed to ``build``/``add`` as ``gate=``, or installed once for the process by
the entry point that sits above both (``ccrk_cli.main``). A build with a threshold set and no gate wired in
fails closed, as a gate that cannot measure does: the version is kept, not published.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ccrk_settings import Settings

if TYPE_CHECKING:
    from model.runtime import Encoder
    from store.version.manifest import IndexManifest

# (item id, {language: captions}) of the build's captioned items: probes when no probe set is configured.
Captioned = Sequence[tuple[str, Mapping[str, Sequence[str]]]]


@dataclass(frozen=True)
class GateThresholds:
    min_recall_at_10: float | None = None
    max_mrv: float | None = None
    max_recall_drop: float | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> GateThresholds:
        return cls(settings.gate_min_recall_at_10, settings.gate_max_mrv, settings.gate_max_recall_drop)

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.min_recall_at_10, self.max_mrv, self.max_recall_drop))


@dataclass
class GateVerdict:
    passed: bool
    reasons: list[str]
    thresholds: dict[str, float | None]
    baseline_version: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class QualityGate(Protocol):
    """Judges a staged version: None when the gate is off (no threshold set), else the verdict."""

    def __call__(
        self,
        stage: Path,
        manifest: IndexManifest,
        encoder: Encoder,
        settings: Settings,
        captioned: Captioned,
    ) -> GateVerdict | None: ...


def unwired_gate(
    stage: Path, manifest: IndexManifest, encoder: Encoder, settings: Settings, captioned: Captioned
) -> GateVerdict | None:
    """The stand-in when no gate was passed or installed: off without thresholds, else a refusal (publishing
    unmeasured would let the very version the thresholds guard against through)."""
    thresholds = GateThresholds.from_settings(settings)
    if not thresholds.enabled:
        return None
    return GateVerdict(
        False,
        [
            "no quality gate is wired into this build, yet gate thresholds are set: run it through `ccrk "
            "index`, or pass gate=monitoring.gate.quality_gate"
        ],
        asdict(thresholds),
    )


# The key under which the ``ccrk`` command's context object carries the gate for index commands.
QUALITY_GATE = "quality_gate"


def gate_from_context(obj: object) -> QualityGate | None:
    """The gate a command's context object carries (None: none was handed in)."""
    return obj.get(QUALITY_GATE) if isinstance(obj, dict) else None


def resolve_gate(gate: QualityGate | None) -> QualityGate:
    """The gate a build runs: the one passed (the ``ccrk`` command passes monitoring's), else
    ``unwired_gate``."""
    return gate if gate is not None else unwired_gate
