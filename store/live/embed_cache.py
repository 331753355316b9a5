"""What the image tower made of each stored product photo (``store.live.photos``), kept so that a process
loading a version, or a second process applying the same upsert, does not encode the photo again.

Every process serving an index embeds the upserts it applies (``service.live.embedder``): without this
file, each of N processes encodes each photo, and again at every restart or swap while the upsert is
pending (about 10 ms a photo on a CPU). One SQLite file in the index's folder, WAL mode, shared by the
processes of the machine::

    live-embeddings.sqlite
        photos(model, digest, embeds, visual, tokens, used_at)   PRIMARY KEY (model, digest)

``model`` names the encoder that made the row (the model's fingerprint, backend and precision), so a new
model never reads an older one's vectors. ``digest`` is the photo's (``PhotoRef.digest``: its bytes'
blake2b-128). Arrays are ``.npy`` bytes (shape and dtype with them, no pickle).

A cache, not a record: it is written without fsync, rows beyond ``max_rows`` go oldest first, and any
row that cannot be read back is a miss (the photo is encoded again). Nothing here ever fails an upsert:
every error leaves the caller to encode, and a folder it may not write (a read-only volume) turns the cache
off for the process.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from store.layout import index_dir
from store.live.changelog import ProcessConnection
from store.live.wal import open_wal

EMBEDDINGS_FILE = "live-embeddings.sqlite"
DEFAULT_MAX_ROWS = 200_000

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PhotoEmbedding:
    """One photo through the image tower: its cross-modal embedding (D,), its visual one (V,) where the
    model has one apart, and its re-rank tokens (T, W) where the model re-ranks."""

    embeds: np.ndarray
    visual: np.ndarray | None
    tokens: np.ndarray | None


def _to_bytes(array: np.ndarray | None) -> bytes | None:
    if array is None:
        return None
    out = io.BytesIO()
    np.save(out, np.ascontiguousarray(array), allow_pickle=False)
    return out.getvalue()


def _from_bytes(data: bytes | None) -> np.ndarray | None:
    return None if data is None else np.load(io.BytesIO(data), allow_pickle=False)


class PhotoEmbeddingCache:
    """The cache of index ``name`` under ``root``: thread-safe, and reopened after a fork."""

    def __init__(self, path: Path, max_rows: int = DEFAULT_MAX_ROWS, busy_timeout_s: float = 2.0) -> None:
        self.path = Path(path)
        self.max_rows = max_rows
        self.busy_timeout_s = busy_timeout_s
        self.off: str | None = None  # why the cache is off for this process, once it is
        self._lock = threading.Lock()
        self._conns: ProcessConnection[sqlite3.Connection] = ProcessConnection(self._open)
        self._puts = 0

    @classmethod
    def for_index(cls, root: Path, name: str, max_rows: int = DEFAULT_MAX_ROWS) -> PhotoEmbeddingCache:
        return cls(index_dir(root, name) / EMBEDDINGS_FILE, max_rows=max_rows)

    def _open(self) -> sqlite3.Connection:
        return open_wal(
            self.path,
            self.busy_timeout_s,
            "OFF",  # a cache: a lost row is encoded again
            "CREATE TABLE IF NOT EXISTS photos (model TEXT NOT NULL, digest TEXT NOT NULL,"
            " embeds BLOB NOT NULL, visual BLOB, tokens BLOB, used_at REAL NOT NULL,"
            " PRIMARY KEY (model, digest))",
        )

    def _failed(self, exc: BaseException) -> None:
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            log.debug("%s busy: %s", self.path, exc)  # another process writing: a miss this time
            return
        self.off = f"{self.path}: {exc}"
        log.warning("the photo embedding cache is off in this process: %s", self.off)

    @contextlib.contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection | None]:
        """The connection, None while the cache is off; an error using it is logged, never raised."""
        with self._lock:
            conn = None
            if self.off is None:
                try:
                    conn = self._conns.get()
                except (sqlite3.Error, OSError) as exc:
                    self._failed(exc)
            try:
                yield conn
            except (sqlite3.Error, OSError) as exc:
                self._failed(exc)

    def get(self, model: str, digests: Sequence[str]) -> dict[str, PhotoEmbedding]:
        """The cached embeddings of ``digests`` by ``model`` (those it holds and can read back)."""
        wanted = sorted(set(digests))
        found: dict[str, PhotoEmbedding] = {}
        rows: list[tuple] = []
        if not wanted:
            return found
        with self._conn() as conn:
            if conn is None:
                return found
            marks = ",".join("?" * len(wanted))
            rows = conn.execute(
                f"SELECT digest, embeds, visual, tokens FROM photos WHERE model = ? AND digest IN ({marks})",
                (model, *wanted),
            ).fetchall()
        for digest, embeds, visual, tokens in rows:
            try:
                vector = _from_bytes(embeds)
                if vector is None or vector.ndim != 1:
                    raise ValueError("not a vector")
                found[str(digest)] = PhotoEmbedding(vector, _from_bytes(visual), _from_bytes(tokens))
            except ValueError as exc:  # a damaged row (np.load raises ValueError): encoded again
                log.debug("cached embedding of photo %s unreadable: %s", digest, exc)
        return found

    def put(self, model: str, items: dict[str, PhotoEmbedding]) -> None:
        """Keep ``items`` (digest: embedding) made by ``model``; beyond ``max_rows``, the oldest go."""
        if not items:
            return
        now = time.time()
        rows = [
            (model, d, _to_bytes(e.embeds), _to_bytes(e.visual), _to_bytes(e.tokens), now)
            for d, e in items.items()
        ]
        with self._conn() as conn:
            if conn is None:
                return
            conn.executemany(
                "INSERT OR REPLACE INTO photos (model, digest, embeds, visual, tokens, used_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            self._puts += len(rows)
            if self._puts >= max(1, self.max_rows // 20):  # counted now and then, not at every put
                self._puts = 0
                (count,) = conn.execute("SELECT count(*) FROM photos").fetchone()
                if count > self.max_rows:
                    conn.execute(
                        "DELETE FROM photos WHERE rowid IN (SELECT rowid FROM photos ORDER BY used_at"
                        " LIMIT ?)",
                        (count - self.max_rows,),
                    )

    def close(self) -> None:
        with self._lock:
            self._conns.close()
