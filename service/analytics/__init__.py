"""Search analytics in the service: each served index's ``QueryRecorder`` (``recorder``: the query log's
buffer and writer, and its events), made by ``open_recorder`` from the settings; the routes are
``service.api.routes.analytics``."""

from __future__ import annotations

from pathlib import Path

from ccrk_settings import Settings
from monitoring.history import history_path
from service.analytics.recorder import QueryRecorder
from service.metrics import Metrics
from store.analytics import QueryIds, QueryLog, analytics_path, load_secret


def analytics_folder(settings: Settings) -> Path:
    """Where the query logs live: beside the monitoring history (``history_db``'s folder when it is set,
    else the index root, as its default file is), one file per index, and the query ids' secret with them."""
    return history_path(settings).parent


def open_recorder(settings: Settings, index: str, metrics: Metrics | None = None) -> QueryRecorder | None:
    """Index ``index``'s recorder, started; None when ``settings.analytics`` is off (AnalyticsError or
    OSError when its log cannot be opened)."""
    if not settings.analytics:
        return None
    folder = analytics_folder(settings)
    query_log = QueryLog(
        analytics_path(folder, index),
        retention_s=settings.analytics_retention_days * 86400.0,
        max_rows=settings.analytics_max_rows,
    )
    recorder = QueryRecorder(
        index,
        query_log,
        QueryIds(load_secret(folder), index),
        capacity=settings.analytics_buffer,
        flush_s=settings.analytics_flush_s,
        event_window_s=settings.analytics_event_window_s,
        metrics=metrics,
    )
    recorder.start()
    return recorder


__all__ = ["QueryRecorder", "analytics_folder", "open_recorder"]
