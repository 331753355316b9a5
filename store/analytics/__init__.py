"""Search analytics' stored formats: the query log of an index (``querylog``: its searches and the
shoppers' events, SQLite in WAL mode beside the monitoring history), query ids (``query_ids``: signed, so an
event is checked without the log), and the report over a time window (``report``)."""

from __future__ import annotations

from store.analytics.query_ids import (
    ExpiredQueryIdError,
    QueryIds,
    UnknownQueryIdError,
    load_secret,
)
from store.analytics.querylog import (
    TOP_IDS,
    AnalyticsError,
    LoggedEvent,
    LoggedQuery,
    QueryLog,
    analytics_path,
    normalise_query,
)
from store.analytics.report import AnalyticsReport, analytics_report

__all__ = [
    "TOP_IDS",
    "AnalyticsError",
    "AnalyticsReport",
    "ExpiredQueryIdError",
    "LoggedEvent",
    "LoggedQuery",
    "QueryIds",
    "QueryLog",
    "UnknownQueryIdError",
    "analytics_path",
    "analytics_report",
    "load_secret",
    "normalise_query",
]
