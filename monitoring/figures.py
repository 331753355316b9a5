"""Plotly figures of the dashboard, built from the history payload (``report.history``).

Figures are built here with plotly's Python graph objects and drawn in the page by plotly.js, the copy
bundled in the same PyPI package and served from this service (no CDN). Every trace carries ``meta``
(metric, language, K) so a page script or a test can tell the traces apart.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from monitoring.report import GATE, served_runs

RECALL_KS = (1, 5, 10)
MARKER_COLOURS = {"index": "#6b7280", "model": "#7c3aed", "gate_refused": "#dc2626", "gate_passed": "#16a34a"}
LAYOUT = {
    "margin": {"l": 60, "r": 30, "t": 50, "b": 40},
    "legend": {"orientation": "h", "y": -0.15},
    "template": "plotly_white",
    "height": 380,
}


# One colour per language across every chart (the model's ten languages first, in their usual order).
LANGUAGE_ORDER = ("en", "de", "fr", "cs", "ja", "zh", "es", "ru", "tr", "id")
PALETTE = qualitative.Plotly + qualitative.D3


def colour(lang: str) -> str:
    if lang in LANGUAGE_ORDER:
        return PALETTE[LANGUAGE_ORDER.index(lang)]
    return PALETTE[len(LANGUAGE_ORDER) + sum(map(ord, lang)) % (len(PALETTE) - len(LANGUAGE_ORDER))]


def stamp(t: float) -> str:
    """Plotly date string (UTC)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _languages(runs: list[dict[str, Any]], traffic: list[dict[str, Any]]) -> list[str]:
    langs: list[str] = []
    for run in runs:
        langs.extend(lang for lang in run["per_language"] if lang not in langs)
    langs.extend(sorted({t["lang"] for t in traffic} - set(langs)))
    return langs


def _add_markers(fig: go.Figure, markers: list[dict[str, Any]]) -> None:
    """Vertical lines at index and model versions and gate verdicts, labelled at the top."""
    for m in markers:
        x = stamp(m["time"])
        colour = MARKER_COLOURS.get(m["kind"], "#6b7280")
        fig.add_shape(
            type="line", x0=x, x1=x, y0=0, y1=1, xref="x", yref="paper", line={"color": colour, "dash": "dot"}
        )
        fig.add_annotation(
            x=x,
            y=1.0,
            xref="x",
            yref="paper",
            text=m["label"][-22:],
            showarrow=False,
            textangle=-90,
            xanchor="right",
            yanchor="top",
            font={"size": 9, "color": colour},
        )


def mrv_figure(payload: dict[str, Any]) -> go.Figure:
    runs = served_runs(payload["runs"])
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x = [stamp(r["time"]) for r in runs]
    fig.add_trace(
        go.Scatter(x=x, y=[r["mrv"] for r in runs], name="MRV", mode="lines+markers", meta={"metric": "mrv"}),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[r["mrv_std"] for r in runs],
            name="mrv_std",
            mode="lines+markers",
            line={"dash": "dash"},
            meta={"metric": "mrv_std"},
        ),
        secondary_y=True,
    )
    refused = [
        r for r in payload["runs"] if r.get("source") == GATE and not (r.get("gate") or {}).get("passed")
    ]
    if refused:
        fig.add_trace(
            go.Scatter(
                x=[stamp(r["time"]) for r in refused],
                y=[r["mrv"] for r in refused],
                name="refused by the gate",
                mode="markers",
                marker={"symbol": "x", "size": 12, "color": MARKER_COLOURS["gate_refused"]},
                text=["; ".join((r.get("gate") or {}).get("reasons") or []) for r in refused],
                meta={"metric": "gate_refused"},
            ),
            secondary_y=False,
        )
    mrv_max = payload["alert_rules"]["mrv_max"]
    fig.add_hline(y=mrv_max, line={"color": "#dc2626", "dash": "dash", "width": 1}, secondary_y=False)
    _add_markers(fig, payload["markers"])
    fig.update_layout(title="Probe MRV (squared ranks) and mrv_std (ranks) over time", **LAYOUT)
    fig.update_yaxes(title_text="MRV", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="mrv_std", secondary_y=True, rangemode="tozero")
    return fig


def recall_figure(payload: dict[str, Any]) -> go.Figure:
    runs = served_runs(payload["runs"])
    langs = _languages(runs, [])
    fig = go.Figure()
    x = [stamp(r["time"]) for r in runs]
    for k in RECALL_KS:
        for lang in langs:
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[r["per_language"].get(lang, {}).get(f"recall_at_{k}") for r in runs],
                    name=lang,
                    mode="lines+markers",
                    visible=k == 10,
                    line={"color": colour(lang)},
                    meta={"metric": "recall", "k": k, "lang": lang},
                )
            )
    buttons = [
        {
            "label": f"Recall@{k}",
            "method": "update",
            "args": [{"visible": [kk == k for kk in RECALL_KS for _ in langs]}],
        }
        for k in RECALL_KS
    ]
    fig.update_layout(
        title="Probe Recall@K per language over time",
        updatemenus=[
            {"buttons": buttons, "active": RECALL_KS.index(10), "x": 1.0, "y": 1.18, "xanchor": "right"}
        ],
        yaxis={"range": [0, 1.05], "title": "recall"},
        **LAYOUT,
    )
    _add_markers(fig, payload["markers"])
    return fig


def traffic_figure(payload: dict[str, Any]) -> go.Figure:
    traffic = payload["traffic"]
    langs = _languages([], traffic)
    fig = make_subplots(
        rows=4,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.05,
        subplot_titles=("queries / minute", "no-good-match rate", "zero-result rate", "latency p95 (ms)"),
    )
    for lang in langs:
        points = [t for t in traffic if t["lang"] == lang]
        x = [stamp(t["minute"]) for t in points]
        for row, metric in enumerate(
            ("count", "no_match_rate", "zero_result_rate", "latency_ms_p95"), start=1
        ):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[t.get(metric) for t in points],
                    name=lang,
                    legendgroup=lang,
                    showlegend=row == 1,
                    mode="lines+markers",
                    line={"color": colour(lang)},
                    meta={"metric": metric, "lang": lang},
                ),
                row=row,
                col=1,
            )
    fig.update_layout(title="Live traffic per language (per minute)", **{**LAYOUT, "height": 720})
    return fig


def ann_figure(payload: dict[str, Any]) -> go.Figure:
    traffic = [t for t in payload["traffic"] if t["ann_samples"]]
    fig = go.Figure()
    for lang in _languages([], traffic):
        points = [t for t in traffic if t["lang"] == lang]
        fig.add_trace(
            go.Scatter(
                x=[stamp(t["minute"]) for t in points],
                y=[t["ann_recall_at_10"] for t in points],
                name=lang,
                mode="lines+markers",
                text=[f"{t['ann_samples']} samples" for t in points],
                line={"color": colour(lang)},
                meta={"metric": "ann_recall_at_10", "lang": lang},
            )
        )
    fig.update_layout(
        title="Live ANN recall@10 vs exact search (sampled queries)",
        yaxis={"range": [0, 1.05], "title": "recall@10"},
        **LAYOUT,
    )
    return fig


def none_rate_figure(report: dict[str, Any]) -> go.Figure:
    """The search-analytics report's (``store.analytics.report``) 'none' share per language over time."""
    points = report["none_rate_over_time"]
    fig = go.Figure()
    for lang in _languages([], points):
        mine = [p for p in points if p["lang"] == lang]
        fig.add_trace(
            go.Scatter(
                x=[stamp(p["start"]) for p in mine],
                y=[p["none_rate"] for p in mine],
                name=lang,
                mode="lines+markers",
                text=[f"{p['none']} of {p['queries']} searches" for p in mine],
                line={"color": colour(lang)},
                meta={"metric": "none_rate", "lang": lang},
            )
        )
    fig.update_layout(
        title="Searches that find no good match, per language (search analytics)",
        yaxis={"range": [0, 1.05], "title": "'none' share"},
        **LAYOUT,
    )
    return fig


def clicks_figure(report: dict[str, Any]) -> go.Figure:
    """The report's click-through rate and MRR per language, most searched first."""
    langs = report["languages"]
    fig = go.Figure()
    for metric, name in (("ctr", "click-through rate"), ("mrr", "mean reciprocal rank")):
        fig.add_trace(
            go.Bar(
                x=[x["lang"] for x in langs],
                y=[x[metric] for x in langs],
                name=name,
                text=[f"{x['queries']} searches" for x in langs],
                meta={"metric": metric},
            )
        )
    fig.update_layout(
        title="Clicks per language (search analytics)", barmode="group", yaxis={"range": [0, 1.05]}, **LAYOUT
    )
    return fig


def analytics_figures(report: dict[str, Any]) -> dict[str, str]:
    """Figure JSON by chart element id, of a search-analytics report as a dict."""
    return {
        "chart-none-rate": none_rate_figure(report).to_json(),
        "chart-clicks": clicks_figure(report).to_json(),
    }


def dashboard_figures(payload: dict[str, Any]) -> dict[str, str]:
    """Figure JSON by chart element id."""
    return {
        "chart-mrv": mrv_figure(payload).to_json(),
        "chart-recall": recall_figure(payload).to_json(),
        "chart-traffic": traffic_figure(payload).to_json(),
        "chart-ann": ann_figure(payload).to_json(),
    }
