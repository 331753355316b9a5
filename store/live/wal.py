"""Opening the live catalogue's small SQLite side files (the reader board, the photo embedding cache):
one connection in WAL mode, shared by threads under the caller's lock, with the schema created."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal


def open_wal(
    path: Path, busy_timeout_s: float, synchronous: Literal["OFF", "NORMAL", "FULL"], *schema: str
) -> sqlite3.Connection:
    """A connection to ``path`` in WAL mode (autocommit), ``schema``'s statements run; closed on failure."""
    conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        for statement in schema:
            conn.execute(statement)
    except BaseException:
        conn.close()
        raise
    return conn
