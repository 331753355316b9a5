"""What the dashboard and ``GET /v1/consistency/history`` show: probe series, version markers, live
traffic and ANN recall per minute, and alerts, computed from the history store."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from monitoring.history import HistoryStore

GATE = "gate"


def recall_drops(
    before_run: dict[str, Any], after_run: dict[str, Any], max_drop: float
) -> list[tuple[str, float, float, float]]:
    """Languages whose recall@10 fell by more than ``max_drop`` from one probe run to another, as
    (lang, before, after, drop); languages absent from ``before_run`` are skipped. Shared by the dashboard's
    alerts and the quality gate, so both judge a drop the same way."""
    drops = []
    for lang, m in after_run["per_language"].items():
        before = before_run["per_language"].get(lang)
        if before is None:
            continue
        drop = before["recall_at_10"] - m["recall_at_10"]
        if drop > max_drop + 1e-9:  # a drop exactly at the limit passes despite float rounding
            drops.append((lang, before["recall_at_10"], m["recall_at_10"], drop))
    return drops


@dataclass(frozen=True)
class AlertRules:
    mrv_max: float
    recall_drop: float


def served_runs(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of served versions (gate runs probe a candidate that may never have been served)."""
    return [r for r in runs if r.get("source") != GATE]


def markers(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where the served index version or the model changed, and every gate verdict."""
    out: list[dict[str, Any]] = []
    last_version: str | None = None
    last_model: str | None = None
    for run in runs:
        if run.get("source") == GATE:
            gate = run.get("gate") or {}
            passed = bool(gate.get("passed"))
            out.append(
                {
                    "time": run["time"],
                    "kind": "gate_passed" if passed else "gate_refused",
                    "label": f"{'passed' if passed else 'refused'}: {run.get('index_version')}",
                    "detail": "; ".join(gate.get("reasons") or []),
                }
            )
            continue
        version, model = run.get("index_version"), run.get("model")
        if version != last_version:
            out.append({"time": run["time"], "kind": "index", "label": str(version), "detail": ""})
        if model != last_model and last_model is not None:
            out.append({"time": run["time"], "kind": "model", "label": str(model), "detail": ""})
        last_version, last_model = version, model
    return out


def alerts(runs: Sequence[dict[str, Any]], rules: AlertRules) -> list[dict[str, Any]]:
    """MRV above the ceiling in the latest run; a language whose recall@10 dropped more than the rule
    against the last run of the previous index version; gate refusals."""
    out: list[dict[str, Any]] = []
    served = served_runs(runs)
    if served:
        latest = served[-1]
        if latest["mrv"] > rules.mrv_max:
            out.append(
                {
                    "kind": "mrv",
                    "lang": None,
                    "message": f"MRV {latest['mrv']:.2f} of {latest.get('index_version')} is above "
                    f"{rules.mrv_max:.2f}",
                }
            )
        previous = next(
            (r for r in reversed(served) if r.get("index_version") != latest.get("index_version")), None
        )
        if previous is not None:
            for lang, before, after, drop in recall_drops(previous, latest, rules.recall_drop):
                out.append(
                    {
                        "kind": "recall_drop",
                        "lang": lang,
                        "message": f"{lang}: recall@10 dropped {drop * 100:.1f} points "
                        f"({before:.3f} -> {after:.3f}) from "
                        f"{previous.get('index_version')} to {latest.get('index_version')}",
                    }
                )
    for run in runs:
        gate = run.get("gate") or {}
        if run.get("source") == GATE and not gate.get("passed", True):
            out.append(
                {
                    "kind": "gate",
                    "lang": None,
                    "message": f"quality gate refused {run.get('index_version')}: "
                    + "; ".join(gate.get("reasons") or ["no reason recorded"]),
                }
            )
    return out


def only_language(run: dict[str, Any], lang: str) -> dict[str, Any]:
    return {**run, "per_language": {k: v for k, v in run["per_language"].items() if k == lang}}


def history(store: HistoryStore, since: float, lang: str | None, rules: AlertRules) -> dict[str, Any]:
    """The whole history payload (blocking: reads the store)."""
    runs = store.runs(since)
    traffic = [b.summary() for b in store.traffic(since) if lang is None or b.lang == lang]
    return {
        "since": since,
        "lang": lang,
        "store": store.backend,
        "runs": [only_language(r, lang) for r in runs] if lang else runs,
        "traffic": traffic,
        "markers": markers(runs),
        "alerts": alerts(runs, rules),
        "alert_rules": {"mrv_max": rules.mrv_max, "recall_drop": rules.recall_drop},
    }
