"""The query log of one index: its searches and the shoppers' events on their results, in SQLite.

One file per index beside the monitoring history (``INDEX_ROOT/INDEX.analytics.sqlite`` by default), in
WAL mode, so every worker of ``ccrk serve --workers N`` on the machine writes it and a report reads it while
they do; each process writes its buffered rows in one transaction (``service.analytics``), not per search.

    queries   one row per search: when, kind (text, photo), the normalised query text or the photo's
              content digest (never the image), the detected language and its confidence, the mode, the
              page's offset, the result count, the top label, the page's product ids (at most ``TOP_IDS``),
              the latency, and the API key's id (never the key, never the client's address)
    events    one row per click, add to cart or purchase: when, its query's id, the product's id, the
              key's id

Retention is bounded twice: rows older than ``retention_s`` and queries beyond ``max_rows`` (the oldest
first) go at each ``prune``; the events of queries gone go with them. A write that fails (a full disk, a
locked file past the busy timeout) raises ``AnalyticsError``: the caller drops the rows and counts them;
searches never wait on it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from store.errors import IndexFormatError

FORMAT = 1
TOP_IDS = 20  # product ids kept per logged page: a click's rank is read from them
MAX_QUERY_CHARS = 200  # a longer query is kept cut (the top queries group what shoppers type)
BUSY_TIMEOUT_S = 2.0
ORPHAN_S = 3600.0  # an event whose query row is not in the log this long after it is pruned

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queries (
    seq INTEGER PRIMARY KEY,
    query_id TEXT NOT NULL UNIQUE,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    query TEXT,
    photo TEXT,
    lang TEXT NOT NULL,
    lang_confidence REAL,
    mode TEXT NOT NULL,
    page_offset INTEGER NOT NULL,
    results INTEGER NOT NULL,
    label TEXT,
    top_ids TEXT NOT NULL,
    latency_ms REAL NOT NULL,
    key_id TEXT
);
CREATE INDEX IF NOT EXISTS queries_at ON queries(at);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    query_id TEXT NOT NULL,
    product_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    key_id TEXT
);
CREATE INDEX IF NOT EXISTS events_query ON events(query_id);
CREATE INDEX IF NOT EXISTS events_at ON events(at);
CREATE TABLE IF NOT EXISTS info (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class AnalyticsError(IndexFormatError):
    """The query log cannot be read or written (a full disk, a damaged file); the message says why."""


@dataclass(frozen=True)
class LoggedQuery:
    """One search as the log keeps it."""

    query_id: str
    at: float  # seconds since the epoch
    kind: str  # text | photo
    query: str | None  # normalised text (``normalise_query``); None for a photo
    photo: str | None  # a photo query's content digest; None for text
    lang: str  # detected language code ('und': unknown; '' for a photo)
    lang_confidence: float | None
    mode: str
    offset: int
    results: int
    label: str | None  # strong | weak | none | None (nothing labelled)
    top_ids: tuple[str, ...]
    latency_ms: float
    key_id: str | None  # the API key's id; 'admin' for the admin key; None anonymous


@dataclass(frozen=True)
class LoggedEvent:
    at: float
    query_id: str
    product_id: str
    kind: str  # click | add_to_cart | purchase (``service.analytics.schemas.EventKind``)
    key_id: str | None


def normalise_query(text: str) -> str:
    """What the top queries group: case folded, whitespace collapsed, cut at ``MAX_QUERY_CHARS``."""
    return " ".join(text.casefold().split())[:MAX_QUERY_CHARS]


def analytics_path(folder: Path, name: str) -> Path:
    """Index ``name``'s query log in ``folder`` (the monitoring history's: ``service.analytics``)."""
    return folder / f"{name}.analytics.sqlite"


class QueryLog:
    """One index's query log (thread-safe: one connection behind a lock; a process opens it once)."""

    def __init__(self, path: Path, *, retention_s: float, max_rows: int) -> None:
        self.path = path
        self.retention_s = retention_s
        self.max_rows = max_rows
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit (an acknowledged event) is on disk, power loss included; the searches' rows
            # are written in one transaction a second, so the fsync costs nothing that matters.
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            found = self._db.execute("SELECT value FROM info WHERE name = 'format'").fetchone()
            if found is None:
                self._db.execute("INSERT OR IGNORE INTO info VALUES ('format', ?)", (str(FORMAT),))
                self._db.commit()
            elif int(found[0]) > FORMAT:
                raise AnalyticsError(f"{path}: query log format {found[0]} is newer than this release's")
        except (sqlite3.Error, OSError) as exc:
            raise AnalyticsError(f"cannot open the query log {path}: {exc}") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> QueryLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, what: str, sql: str, rows: Sequence[tuple]) -> None:
        with self._lock:
            try:
                with self._db:
                    self._db.executemany(sql, rows)
            except sqlite3.Error as exc:
                raise AnalyticsError(f"cannot {what} in {self.path}: {exc}") from None

    def add_queries(self, queries: Sequence[LoggedQuery]) -> None:
        """Every query in one transaction (a query id already logged is kept as first written)."""
        self._write(
            "log queries",
            "INSERT OR IGNORE INTO queries (query_id, at, kind, query, photo, lang, lang_confidence, mode, "
            "page_offset, results, label, top_ids, latency_ms, key_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    q.query_id,
                    q.at,
                    q.kind,
                    q.query,
                    q.photo,
                    q.lang,
                    q.lang_confidence,
                    q.mode,
                    q.offset,
                    q.results,
                    q.label,
                    json.dumps(list(q.top_ids[:TOP_IDS]), ensure_ascii=False),
                    q.latency_ms,
                    q.key_id,
                )
                for q in queries
            ],
        )

    def add_events(self, events: Sequence[LoggedEvent]) -> None:
        """Every event in one transaction, durable when it returns (the caller acknowledges them then)."""
        self._write(
            "log events",
            "INSERT INTO events (at, query_id, product_id, kind, key_id) VALUES (?, ?, ?, ?, ?)",
            [(e.at, e.query_id, e.product_id, e.kind, e.key_id) for e in events],
        )

    def prune(self, now: float | None = None) -> int:
        """Forget the queries and events older than the retention, and the oldest queries beyond
        ``max_rows`` with their events; how many queries went."""
        cutoff = (time.time() if now is None else now) - self.retention_s
        with self._lock:
            try:
                with self._db:
                    gone = self._db.execute("DELETE FROM queries WHERE at < ?", (cutoff,)).rowcount
                    (count,) = self._db.execute("SELECT COUNT(*) FROM queries").fetchone()
                    if count > self.max_rows:
                        gone += self._db.execute(
                            "DELETE FROM queries WHERE seq IN (SELECT seq FROM queries ORDER BY seq LIMIT ?)",
                            (count - self.max_rows,),
                        ).rowcount
                        (oldest,) = self._db.execute("SELECT MIN(at) FROM queries").fetchone()
                        if oldest is not None:
                            cutoff = max(cutoff, float(oldest))
                    self._db.execute("DELETE FROM events WHERE at < ?", (cutoff,))
                    # Events whose query went (pruned) and cannot still be buffered somewhere: an hour on.
                    self._db.execute(
                        "DELETE FROM events WHERE at < ? AND query_id NOT IN (SELECT query_id FROM queries)",
                        ((time.time() if now is None else now) - ORPHAN_S,),
                    )
            except sqlite3.Error as exc:
                raise AnalyticsError(f"cannot prune {self.path}: {exc}") from None
        return int(gone)

    def counts(self) -> dict[str, int]:
        """Rows held and the file's bytes on disk (its WAL included)."""
        with self._lock:
            try:
                (queries,) = self._db.execute("SELECT COUNT(*) FROM queries").fetchone()
                (events,) = self._db.execute("SELECT COUNT(*) FROM events").fetchone()
            except sqlite3.Error as exc:
                raise AnalyticsError(f"cannot read {self.path}: {exc}") from None
        size = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())
        return {"queries": int(queries), "events": int(events), "bytes": int(size)}

    def read(self, sql: str, args: Sequence[object] = ()) -> list[tuple]:
        """Rows of a read-only statement (``store.analytics.report``), on a read-only connection of its own:
        a report of seconds never holds up the writes (WAL readers do not block the writer)."""
        try:
            reader = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        except sqlite3.Error as exc:
            raise AnalyticsError(f"cannot read {self.path}: {exc}") from None
        try:
            return reader.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise AnalyticsError(f"cannot read {self.path}: {exc}") from None
        finally:
            reader.close()
