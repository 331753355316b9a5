"""The quality gate on publishing: probe thresholds a new index version must meet before CURRENT moves.

Thresholds come from the settings (all off by default): every language's recall@10 at least
``gate_min_recall_at_10``, MRV at most ``gate_max_mrv``, no language's recall@10 more than
``gate_max_recall_drop`` below the CURRENT version's on the same probes. The builder runs
``quality_gate`` on the staged version; it is injected, since the indexer may not import monitoring
(``ccrk_cli`` installs it; ``indexer.quality_gate`` holds the thresholds and verdict types). A refused
version is installed (kept) but not published, and the verdict goes to the build report, the manifest
and the probe history (where the dashboard shows it). Probes search each version in its default mode:
hybrid where it has searched text fields (products), else image.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ccrk_settings import Settings
from indexer.quality_gate import Captioned, GateThresholds, GateVerdict  # the builder's types, re-exported
from model.runtime import Encoder
from monitoring.history import HistoryError, open_history
from monitoring.probe import ProbeError, index_searcher, run_probes, run_record
from monitoring.probe_set import Probe, ProbeSetError, load_probe_set, probes_from_captions
from monitoring.report import recall_drops
from store.errors import IndexFormatError
from store.opening import open_path, open_version
from store.products.channels import default_mode
from store.version.manifest import IndexManifest
from store.version.versions import current_version

log = logging.getLogger(__name__)


def evaluate_gate(
    candidate: Mapping[str, Any],
    baseline: Mapping[str, Any] | None,
    thresholds: GateThresholds,
    *,
    baseline_version: str | None = None,
) -> GateVerdict:
    """Check one run's metrics (``run_probes`` output) against the thresholds; every failure is a reason."""
    reasons: list[str] = []
    per_language = candidate["per_language"]
    if thresholds.min_recall_at_10 is not None:
        for lang, m in per_language.items():
            if m["recall_at_10"] < thresholds.min_recall_at_10:
                reasons.append(
                    f"{lang}: recall@10 {m['recall_at_10']:.3f} is below the minimum "
                    f"{thresholds.min_recall_at_10:.3f}"
                )
    if thresholds.max_mrv is not None and candidate["mrv"] > thresholds.max_mrv:
        reasons.append(f"MRV {candidate['mrv']:.2f} is above the ceiling {thresholds.max_mrv:.2f}")
    if thresholds.max_recall_drop is not None and baseline is not None:
        for lang, before, after, drop in recall_drops(baseline, candidate, thresholds.max_recall_drop):
            reasons.append(
                f"{lang}: recall@10 fell {drop * 100:.1f} points against {baseline_version or 'CURRENT'} "
                f"({before:.3f} -> {after:.3f}), more than {thresholds.max_recall_drop * 100:.1f}"
            )
    return GateVerdict(not reasons, reasons, asdict(thresholds), baseline_version)


def gate_probes(settings: Settings, captioned: Captioned) -> list[Probe]:
    """The configured probe set, else probes drawn from the build's captioned items."""
    if settings.probe_set is not None:
        return load_probe_set(settings.probe_set)
    return probes_from_captions(captioned, n=settings.gate_probe_size, seed=0)


def quality_gate(
    stage: Path,
    manifest: IndexManifest,
    encoder: Encoder,
    settings: Settings,
    captioned: Captioned,
) -> GateVerdict | None:
    """The builder's gate (an ``indexer.quality_gate.QualityGate``): None when no threshold is set (no
    gate), else the verdict on the staged version. Fails closed: a gate that cannot measure refuses, saying
    why."""
    thresholds = GateThresholds.from_settings(settings)
    if not thresholds.enabled:
        return None
    refuse = GateVerdict(False, [], asdict(thresholds))
    try:
        probes = gate_probes(settings, captioned)
    except ProbeSetError as exc:
        refuse.reasons.append(f"the probe set cannot be read: {exc}")
        return refuse
    if not probes:
        refuse.reasons.append(
            "no probes: set CCRK_PROBE_SET, or build from a source with captions in two or more languages"
        )
        return refuse
    search_kw: dict[str, Any] = {"depth": settings.probe_depth}
    try:
        with open_path(stage, manifest) as staged:
            # What a query gets by default (``mode``: hybrid where the version has searched text fields).
            mode = default_mode(getattr(staged, "products", None))
            searcher = index_searcher(staged, encoder, manifest.model_name, mode=mode)
            candidate = run_probes(probes, searcher, **search_kw)
    except ProbeError as exc:
        refuse.reasons.append(f"the probe run failed: {exc}")
        return refuse
    baseline: dict[str, Any] | None = None
    current = current_version(settings.index_root, manifest.name)
    notes: list[str] = []
    if current is not None and thresholds.max_recall_drop is not None:
        try:
            with open_version(settings.index_root, manifest.name, current) as published:
                # CURRENT in its own default mode: the drop is what shoppers would lose.
                mode_now = default_mode(getattr(published, "products", None))
                searcher = index_searcher(published, encoder, mode=mode_now)
                baseline = run_probes(probes, searcher, **search_kw)
        except (IndexFormatError, OSError, ProbeError) as exc:
            notes.append(f"CURRENT {current} could not be probed ({exc}); no drop check")
    verdict = evaluate_gate(candidate, baseline, thresholds, baseline_version=current)
    verdict.notes.extend([f"the gate probed the version's default mode, {mode}", *notes])
    record = run_record(
        {**candidate, "index_version": manifest.version, "model": manifest.model_name, "mode": mode},
        source="gate",
        gate={"passed": verdict.passed, "reasons": verdict.reasons, "baseline_version": current},
    )
    store = open_history(settings, manifest.name)  # the built index's history, not the served one's
    try:
        store.add_run(record)
    except HistoryError as exc:
        log.warning("gate run not stored in the history: %s", exc)
    finally:
        store.close()
    return verdict
