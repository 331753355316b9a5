"""History of probe runs and live traffic: Redis when ``CCRK_REDIS_URL`` is set (shared by every service
process and the indexer), else SQLite at ``history_db`` (default: one file per index, ``history_path``).
Both keep ``history_retention_days``.

Redis layout (under ``cache_prefix + "monitor:"``): ``runs`` a sorted set of run records (JSON) scored by
time; ``traffic:<minute>:<lang>`` hashes whose fields are added to (HINCRBY), so several processes'
minutes sum up, expiring after the retention; ``traffic`` a sorted set of their ``<minute>:<lang>`` names.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import redis

from ccrk_settings import Settings
from monitoring.traffic import LATENCY_BOUNDS_MS, Bucket

_SCALARS = ("count", "zero", "top_sum", "top_n", "ann_n", "ann_sum", "no_match")
_FLOATS = {"top_sum", "ann_sum"}


class HistoryError(RuntimeError):
    """The history store cannot be read or written (Redis down, SQLite file unusable)."""


class HistoryStore(ABC):
    retention_s: float

    @abstractmethod
    def add_run(self, record: dict[str, Any]) -> None: ...

    @abstractmethod
    def runs(self, since: float, until: float | None = None) -> list[dict[str, Any]]:
        """Run records with since <= time (<= until), oldest first."""

    @abstractmethod
    def add_traffic(self, buckets: list[Bucket]) -> None:
        """Add the buckets to whatever is stored for the same minute and language."""

    @abstractmethod
    def traffic(self, since: float) -> list[Bucket]:
        """Stored buckets whose minute starts at or after ``since``, by minute then language."""

    @abstractmethod
    def prune(self, now: float) -> None:
        """Forget what is older than the retention."""

    def close(self) -> None:  # noqa: B027 - optional for stores without resources
        pass

    @property
    @abstractmethod
    def backend(self) -> str: ...


class RedisHistory(HistoryStore):
    def __init__(self, url: str, prefix: str, retention_s: float, timeout_s: float = 2.0) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.prefix = prefix + "monitor:"
        self.retention_s = retention_s

    @property
    def backend(self) -> str:
        return "redis"

    def _call(self, what: str, fn: Any) -> Any:
        try:
            return fn()
        except (redis.RedisError, OSError) as exc:
            raise HistoryError(f"history store (Redis) cannot {what}: {type(exc).__name__}: {exc}") from None

    def add_run(self, record: dict[str, Any]) -> None:
        member = json.dumps(record, sort_keys=True, ensure_ascii=False)
        self._call(
            "store a probe run", lambda: self.client.zadd(self.prefix + "runs", {member: record["time"]})
        )

    def runs(self, since: float, until: float | None = None) -> list[dict[str, Any]]:
        raw = self._call(
            "read probe runs",
            lambda: self.client.zrangebyscore(
                self.prefix + "runs", since, "+inf" if until is None else until
            ),
        )
        return [json.loads(m) for m in raw]

    def add_traffic(self, buckets: list[Bucket]) -> None:
        if not buckets:
            return
        ttl = int(self.retention_s) + 120

        def write() -> None:
            pipe = self.client.pipeline(transaction=False)
            for b in buckets:
                key = f"{self.prefix}traffic:{b.minute}:{b.lang}"
                for name in _SCALARS:
                    value = getattr(b, name)
                    if value:
                        if name in _FLOATS:
                            pipe.hincrbyfloat(key, name, float(value))
                        else:
                            pipe.hincrby(key, name, int(value))
                for i, n in enumerate(b.latency_hist):
                    if n:
                        pipe.hincrby(key, f"l{i}", n)
                pipe.expire(key, ttl)
                pipe.zadd(self.prefix + "traffic", {f"{b.minute}:{b.lang}": b.minute})
            pipe.execute()

        self._call("store traffic", write)

    def traffic(self, since: float) -> list[Bucket]:
        def read() -> list[Bucket]:
            names = [n.decode() for n in self.client.zrangebyscore(self.prefix + "traffic", since, "+inf")]
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(f"{self.prefix}traffic:{name}")
            out = []
            for name, fields in zip(names, pipe.execute(), strict=True):
                if not fields:
                    continue  # expired meanwhile
                minute, lang = name.split(":", 1)
                data = {k.decode(): v.decode() for k, v in fields.items()}
                bucket = Bucket(int(minute), lang)
                for scalar in _SCALARS:
                    cast = float if scalar in _FLOATS else int
                    setattr(bucket, scalar, cast(data.get(scalar, 0)))
                bucket.latency_hist = [int(data.get(f"l{i}", 0)) for i in range(len(LATENCY_BOUNDS_MS) + 1)]
                out.append(bucket)
            return sorted(out, key=lambda b: (b.minute, b.lang))

        return self._call("read traffic", read)

    def prune(self, now: float) -> None:
        cutoff = now - self.retention_s

        def prune() -> None:
            pipe = self.client.pipeline(transaction=False)
            pipe.zremrangebyscore(self.prefix + "runs", "-inf", f"({cutoff}")
            pipe.zremrangebyscore(self.prefix + "traffic", "-inf", f"({cutoff}")
            pipe.execute()

        self._call("prune history", prune)

    def close(self) -> None:
        self.client.close()


SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs(time REAL NOT NULL, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS runs_time ON runs(time);
CREATE TABLE IF NOT EXISTS traffic(
    minute INTEGER NOT NULL, lang TEXT NOT NULL,
    count INTEGER NOT NULL, zero INTEGER NOT NULL, top_sum REAL NOT NULL, top_n INTEGER NOT NULL,
    ann_n INTEGER NOT NULL, ann_sum REAL NOT NULL, latency_hist TEXT NOT NULL,
    no_match INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(minute, lang)
);
"""
# Columns added after the first schema: (name, declaration), added to an older file on open.
SQLITE_ADDED_COLUMNS = (("no_match", "INTEGER NOT NULL DEFAULT 0"),)


class SqliteHistory(HistoryStore):
    """One connection per call (any thread, any process); WAL so readers never wait for the writer."""

    def __init__(self, path: Path, retention_s: float) -> None:
        self.path = Path(path)
        self.retention_s = retention_s
        self._lock = threading.Lock()
        self._ready = False

    @property
    def backend(self) -> str:
        return "sqlite"

    def _connect(self) -> sqlite3.Connection:
        try:
            if not self._ready:
                with self._lock:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    con = sqlite3.connect(self.path, timeout=5)
                    con.execute("PRAGMA journal_mode=WAL")
                    con.executescript(SQLITE_SCHEMA)
                    present = {row[1] for row in con.execute("PRAGMA table_info(traffic)")}
                    for name, declaration in SQLITE_ADDED_COLUMNS:
                        if name not in present:
                            con.execute(f"ALTER TABLE traffic ADD COLUMN {name} {declaration}")
                    con.commit()
                    con.close()
                    self._ready = True
            return sqlite3.connect(self.path, timeout=5)
        except (OSError, sqlite3.Error) as exc:
            raise HistoryError(f"history store {self.path} cannot be opened: {exc}") from None

    def _run(self, what: str, fn: Any, *, read_then_write: bool = False) -> Any:
        """``fn(connection)`` in one transaction. ``read_then_write``: it takes the write lock first (BEGIN
        IMMEDIATE), since sqlite3 begins a transaction only at the first write: two processes adding to the
        same minute's row both read its old counts, and the second write lost the first one's searches."""
        con = self._connect()
        try:
            with con:
                if read_then_write:
                    con.execute("BEGIN IMMEDIATE")
                return fn(con)
        except sqlite3.Error as exc:
            raise HistoryError(f"history store {self.path} cannot {what}: {exc}") from None
        finally:
            con.close()

    def add_run(self, record: dict[str, Any]) -> None:
        text = json.dumps(record, sort_keys=True, ensure_ascii=False)
        self._run(
            "store a probe run", lambda c: c.execute("INSERT INTO runs VALUES (?, ?)", (record["time"], text))
        )

    def runs(self, since: float, until: float | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT record FROM runs WHERE time >= ?", [since]
        if until is not None:
            sql, args = sql + " AND time <= ?", [*args, until]
        rows = self._run("read probe runs", lambda c: c.execute(sql + " ORDER BY time", args).fetchall())
        return [json.loads(r) for (r,) in rows]

    def add_traffic(self, buckets: list[Bucket]) -> None:
        def write(con: sqlite3.Connection) -> None:
            for b in buckets:
                row = con.execute(
                    "SELECT count, zero, top_sum, top_n, ann_n, ann_sum, latency_hist, no_match FROM traffic "
                    "WHERE minute = ? AND lang = ?",
                    (b.minute, b.lang),
                ).fetchone()
                merged = Bucket(b.minute, b.lang)
                merged.merge(b)
                if row is not None:
                    old = Bucket(b.minute, b.lang, *row[:6], latency_hist=json.loads(row[6]), no_match=row[7])
                    merged.merge(old)
                con.execute(
                    "INSERT OR REPLACE INTO traffic (minute, lang, count, zero, top_sum, top_n, ann_n, "
                    "ann_sum, latency_hist, no_match) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        merged.minute,
                        merged.lang,
                        merged.count,
                        merged.zero,
                        merged.top_sum,
                        merged.top_n,
                        merged.ann_n,
                        merged.ann_sum,
                        json.dumps(merged.latency_hist),
                        merged.no_match,
                    ),
                )

        if buckets:
            self._run("store traffic", write, read_then_write=True)

    def traffic(self, since: float) -> list[Bucket]:
        rows = self._run(
            "read traffic",
            lambda c: c.execute(
                "SELECT minute, lang, count, zero, top_sum, top_n, ann_n, ann_sum, latency_hist, no_match "
                "FROM traffic WHERE minute >= ? ORDER BY minute, lang",
                (since,),
            ).fetchall(),
        )
        return [Bucket(*r[:8], latency_hist=json.loads(r[8]), no_match=r[9]) for r in rows]

    def prune(self, now: float) -> None:
        cutoff = now - self.retention_s

        def prune(con: sqlite3.Connection) -> None:
            con.execute("DELETE FROM runs WHERE time < ?", (cutoff,))
            con.execute("DELETE FROM traffic WHERE minute < ?", (cutoff,))

        self._run("prune history", prune)


def history_path(settings: Settings, index_name: str | None = None) -> Path:
    """The SQLite file: ``history_db``, else one beside the index it is about (``index_name``, default the
    served one), so two services on a machine never show each other's traffic and probe runs."""
    if settings.history_db is not None:
        return settings.history_db
    return settings.index_root / f"{index_name or settings.index_name}.monitoring.sqlite"


def open_history(settings: Settings, index_name: str | None = None) -> HistoryStore:
    """The store the settings name: Redis when redis_url is set, else the SQLite file (opened lazily) of
    ``history_path``."""
    retention_s = settings.history_retention_days * 86400.0
    if settings.redis_url:
        return RedisHistory(settings.redis_url, settings.cache_prefix, retention_s)
    return SqliteHistory(history_path(settings, index_name), retention_s)
