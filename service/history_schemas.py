"""Response models of ``GET /v1/consistency/history`` (they are its OpenAPI schema): the shape of
``monitoring.report.history``, kept with the service because it is the HTTP contract."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class LanguageProbeMetrics(BaseModel):
    model_config = ConfigDict(extra="allow")
    recall_at_1: float
    recall_at_5: float
    recall_at_10: float
    mean_rank: float = Field(description="Mean 0-based target rank (capped at the probe depth).")
    overlap_at_10: float = Field(description="Mean overlap@10 with the other languages' lists.")
    latency_ms_p50: float
    latency_ms_p95: float


class GateResult(BaseModel):
    model_config = ConfigDict(extra="allow")
    passed: bool
    reasons: list[str]
    baseline_version: str | None = None


class ProbeRun(BaseModel):
    model_config = ConfigDict(extra="allow")
    time: float = Field(description="Unix time the run ended.")
    source: str = Field(description="startup, swap, schedule (service), cli, or gate (a build candidate).")
    index_version: str | None
    model: str | None
    n_probes: int
    depth: int
    mrv: float = Field(description="MRV over the probes' target ranks (squared rank units).")
    mrv_std: float = Field(description="Mean per-probe standard deviation of the ranks.")
    mean_overlap: float
    recall_at_10_mean: float
    latency_ms_p50: float
    latency_ms_p95: float
    per_language: dict[str, LanguageProbeMetrics]
    gate: GateResult | None = None


class TrafficPoint(BaseModel):
    minute: int = Field(description="Unix time of the minute's start.")
    lang: str
    count: int
    zero_result_rate: float | None
    no_match_rate: float | None = Field(
        None, description="Share of queries whose top result was labelled 'none' (no good match)."
    )
    mean_top_score: float | None
    latency_ms_p50: float | None
    latency_ms_p95: float | None
    latency_ms_p99: float | None
    ann_samples: int
    ann_recall_at_10: float | None = Field(description="Sampled live queries: ANN recall@10 vs exact.")


class Marker(BaseModel):
    time: float
    kind: str = Field(description="index, model, gate_refused or gate_passed.")
    label: str
    detail: str


class Alert(BaseModel):
    kind: str = Field(description="mrv, recall_drop or gate.")
    lang: str | None
    message: str


class HistoryResponse(BaseModel):
    since: float
    lang: str | None
    store: str = Field(description="redis or sqlite.")
    runs: list[ProbeRun]
    traffic: list[TrafficPoint]
    markers: list[Marker]
    alerts: list[Alert]
    alert_rules: dict[str, Any]
