"""Consistency history (JSON) and the operators' dashboard (HTML with plotly charts)."""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from monitoring.figures import analytics_figures, dashboard_figures, stamp
from monitoring.history import HistoryError
from monitoring.report import AlertRules, history
from service.api.deps import RuntimeDep
from service.api.routes.pages import templates
from service.errors import InvalidInputError, ServiceError
from service.history_schemas import HistoryResponse
from service.runtime import Runtime
from service.schemas import LangCode
from store.analytics import AnalyticsError, analytics_report

router = APIRouter(tags=["monitoring"])
DEFAULT_WINDOW_S = 7 * 86400


class HistoryUnavailableError(ServiceError):
    status_code = 503
    error_type = "history_unavailable"


def _rules(runtime: Runtime) -> AlertRules:
    return AlertRules(runtime.settings.alert_mrv_max, runtime.settings.alert_recall_drop)


async def _history(runtime: Runtime, since: float, lang: str | None) -> dict[str, Any]:
    if lang is not None and runtime.languages and lang not in runtime.languages:
        raise InvalidInputError(
            f"language {lang!r} is not one of the model's: {', '.join(runtime.languages)}",
            loc=("query", "lang"),
        )
    store = runtime.monitor.store
    if store is None:
        raise HistoryUnavailableError("the service is still starting")
    try:
        return await anyio.to_thread.run_sync(history, store, since, lang, _rules(runtime))
    except HistoryError as exc:
        raise HistoryUnavailableError(str(exc)) from None


@router.get(
    "/v1/consistency/history",
    response_model=HistoryResponse,
    responses={
        422: {"description": "Invalid input; the error names the field."},
        503: {"description": "History store unavailable."},
    },
)
async def consistency_history(
    runtime: RuntimeDep,
    since: Annotated[
        datetime | None,
        Query(description="ISO 8601 time or unix seconds (default: 7 days ago); naive is UTC."),
    ] = None,
    lang: Annotated[LangCode | None, Query(description="Only this language's series.")] = None,
) -> HistoryResponse:
    """Probe runs (per-language Recall@1/5/10, MRV, mrv_std, overlap, latency), version and gate markers,
    live traffic and ANN recall per minute, and alerts, oldest first."""
    if since is None:
        start = time.time() - DEFAULT_WINDOW_S
    else:
        start = (since if since.tzinfo else since.replace(tzinfo=UTC)).timestamp()
    return HistoryResponse.model_validate(await _history(runtime, start, lang))


async def _analytics(runtime: Runtime, hours: float) -> dict[str, Any] | None:
    """The default index's search-analytics report over the window (None: analytics off, or its log cannot
    be read: the rest of the dashboard is drawn all the same)."""
    recorder = runtime.recorder(runtime.settings.index_name)
    if recorder is None:
        return None
    now = time.time()
    bucket_s = max(300.0, round(hours * 3600.0 / 48.0 / 300.0) * 300.0)  # about 48 points
    try:
        report = await anyio.to_thread.run_sync(
            lambda: analytics_report(recorder.log, since=now - hours * 3600, until=now, bucket_s=bucket_s)
        )
    except AnalyticsError:
        return None
    return dataclasses.asdict(report)


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
async def dashboard(
    request: Request,
    runtime: RuntimeDep,
    hours: Annotated[float, Query(gt=0, le=24 * 366)] = 24 * 7,
    lang: Annotated[LangCode | None, Query()] = None,
) -> Response:
    payload = await _history(runtime, time.time() - hours * 3600, lang)
    figures = await anyio.to_thread.run_sync(dashboard_figures, payload)
    analytics = await _analytics(runtime, hours)
    if analytics is not None:
        figures.update(await anyio.to_thread.run_sync(analytics_figures, analytics))
    holder = runtime.holders.get(runtime.settings.index_name)
    served = holder.served if holder is not None else None
    runs = [r for r in payload["runs"] if r.get("source") != "gate"]
    monitor = runtime.monitor
    context = {
        "figures": figures,
        "alerts": payload["alerts"],
        "latest": runs[-1] if runs else None,
        "latest_time": stamp(runs[-1]["time"]) if runs else None,
        "n_runs": len(runs),
        "n_traffic": len(payload["traffic"]),
        "markers": [{**m, "when": stamp(m["time"])} for m in payload["markers"]],
        "served": served.index.manifest if served is not None else None,
        "store": payload["store"],
        "probe_status": monitor.probe_error or f"{len(monitor.probes or [])} probes",
        "settings": runtime.settings,
        "hours": hours,
        "lang": lang,
        "languages": runtime.languages,
        "analytics": analytics,
    }
    return templates().TemplateResponse(request, "dashboard.html", context)
