"""The live catalogue's change log: product writes (upsert, patch, delete) committed durably, each with a
sequence number, before the write is acknowledged; read back in order by every process serving the index,
and folded into the next version by a build.

``records``    what a change is, and its versioned JSON record
``changelog``  the ``ChangeLog`` interface, and its embedded SQLite backend (a file in the index's folder)
``postgres``   the PostgreSQL backend, for processes on several machines (psycopg, imported when used)
``listen``     its ``LISTEN``: one connection per process hearing each append's ``NOTIFY`` as it commits

Beside the log: ``photos`` (the upserted photos' bytes), ``embed_cache`` (what the image tower made of
them), ``readers`` (which process shows which sequence) and ``wake`` (waking them), ``overlay``, ``delta``,
``channels`` and ``view`` (a version seen through the changes), ``wal`` (the side files' SQLite).
"""

from __future__ import annotations

from pathlib import Path

from store.live.changelog import (
    DEFAULT_PAGE,
    MAX_BATCH,
    MAX_PAGE,
    ChangeLog,
    SqliteChangeLog,
    changelog_path,
)
from store.live.records import (
    RECORD_FORMAT,
    Change,
    Delete,
    Entry,
    Patch,
    PhotoRef,
    Upsert,
    decode_change,
    encode_change,
    validate_change,
)


def open_changelog(root: Path, name: str, dsn: str | None = None) -> ChangeLog:
    """Index ``name``'s log: in PostgreSQL at ``dsn`` when one is given, else the
    SQLite file in the index's folder under ``root``."""
    if dsn:
        from store.live.postgres import PostgresChangeLog

        return PostgresChangeLog(dsn, name)
    return SqliteChangeLog.for_index(root, name)


__all__ = [
    "DEFAULT_PAGE",
    "MAX_BATCH",
    "MAX_PAGE",
    "RECORD_FORMAT",
    "Change",
    "ChangeLog",
    "Delete",
    "Entry",
    "Patch",
    "PhotoRef",
    "SqliteChangeLog",
    "Upsert",
    "changelog_path",
    "decode_change",
    "encode_change",
    "open_changelog",
    "validate_change",
]
