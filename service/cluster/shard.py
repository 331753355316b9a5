"""``ShardServer``: shard ``i`` of any version of one index, the body of one Ray Serve deployment.

Every call names the version it is for, so one answer never mixes versions: the ingress leases a version
and asks every shard for exactly that one. A replica opens ``VERSION/shard-{i:03d}`` as an ordinary
``IndexVersion`` the first time a call names it (a replica started after a swap, or one replacing a dead
replica, opens the older version too while requests still use it) and keeps it open until the ingress
releases it (or CURRENT names another) and it has been idle ``idle_s``, or it is the least recently used
beyond ``max_versions``; never while a call is reading it (``service.cluster.deployments`` runs each call in
a thread, so one replica serves several at once).

A plain class (no Ray import): tests and a single process can use it directly.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from store.errors import IndexFormatError
from store.layout import MANIFEST_FILE, index_dir
from store.shards.sharded import load_shard_manifest
from store.version.manifest import IndexManifest
from store.version.reader import IndexVersion
from store.version.sharding import Sharding
from store.version.versions import current_version

Results = tuple[np.ndarray, np.ndarray]


class _Open:
    def __init__(self, index: IndexVersion) -> None:
        self.index = index
        self.used = time.monotonic()
        self.released = False
        self.busy = 0  # calls reading it now (in threads): never closed under them


class ShardServer:
    """Shard ``shard`` of the versions of index ``name`` under ``root`` (a shared file system)."""

    def __init__(
        self, root: str, name: str, shard: int, *, max_versions: int = 3, idle_s: float = 60.0
    ) -> None:
        self.root = Path(root)
        self.name = name
        self.shard = int(shard)
        self.max_versions = max_versions
        self.idle_s = idle_s
        self._open: dict[str, _Open] = {}
        self._lock = threading.Lock()
        self._current: tuple[float, str | None] = (-1.0, None)  # (read at, CURRENT's version)
        self._loading: dict[str, threading.Event] = {}  # versions being loaded, set when done

    def _current_version(self, now: float) -> str | None:
        """CURRENT, read at most once a second (under the lock). The ingress's ``open`` and ``release`` reach
        one replica of a shard: the others load a version CURRENT newly names in the background (so their
        first call for it does not wait for the load), and close one CURRENT no longer names once idle."""
        read_at, version = self._current
        if now - read_at < 1.0:
            return version
        try:
            version = current_version(self.root, self.name)
        except (OSError, IndexFormatError):  # a flaky shared file system: keep what was read last
            return version
        self._current = (now, version)
        if version is not None and version not in self._open and version not in self._loading:
            threading.Thread(target=self._preload, args=(version,), daemon=True).start()
        return version

    # -- versions --------------------------------------------------------------------------------------------

    def _load(self, version: str) -> IndexVersion:
        folder = index_dir(self.root, self.name) / version
        manifest = IndexManifest.load(folder / MANIFEST_FILE)
        if not manifest.is_sharded:
            raise IndexFormatError(f"{folder} is not a sharded version")
        sharding = Sharding.from_dict(manifest.sharding)
        if self.shard >= sharding.shard_count:
            raise IndexFormatError(f"{folder} has {sharding.shard_count} shards, no shard {self.shard}")
        shard_manifest, digest = load_shard_manifest(folder, sharding, self.shard)
        entry = sharding.shards[self.shard]
        if digest != entry.manifest_sha256:
            raise IndexFormatError(f"{folder / entry.dir}: manifest sha256 differs from the version's")
        return IndexVersion(folder / entry.dir, shard_manifest)

    def _preload(self, version: str) -> None:
        with contextlib.suppress(Exception):  # a call for it loads it again and reports the error
            self._release_call(self._acquire(version, serving=False))

    def _release_call(self, found: _Open) -> None:
        with self._lock:
            found.busy -= 1
            found.used = time.monotonic()

    def _acquire(self, version: str, serving: bool) -> _Open:
        """The open version with one more call on it, loaded first if needed: outside the lock (reading a
        shard's files takes long; calls for other versions go on meanwhile), once per version."""
        while True:
            with self._lock:
                found = self._open.get(version)
                if found is not None:
                    found.used = time.monotonic()
                    if serving:
                        found.released = False
                    found.busy += 1
                    return found
                loading = self._loading.get(version)
                mine = loading is None
                if mine:
                    loading = self._loading[version] = threading.Event()
            if not mine:
                loading.wait()
                continue  # loaded (or failed: then this call tries itself and reports the error)
            try:
                index = self._load(version)
            except BaseException:
                with self._lock:
                    self._loading.pop(version, None)
                loading.set()
                raise
            with self._lock:
                found = self._open[version] = _Open(index)
                self._loading.pop(version, None)
                found.busy += 1
            loading.set()
            return found

    @contextlib.contextmanager
    def _using(self, version: str, *, serving: bool = False) -> Iterator[IndexVersion]:
        """``version`` open for one call; ``serving``: the ingress starts serving it (again)."""
        found = self._acquire(version, serving)
        try:
            with self._lock:
                self._evict(keep=version)
            yield found.index
        finally:
            self._release_call(found)

    def _evict(self, keep: str) -> None:
        now = time.monotonic()
        idle = [v for v, o in self._open.items() if v != keep and not o.busy]
        current = self._current_version(now)
        for version in idle:
            opened = self._open[version]
            # Released here: idle_s. Not released here but no longer CURRENT (released on another replica,
            # or served over CURRENT by an admin override): ten times as long, so an override keeps it warm.
            limit = self.idle_s if opened.released else None if version == current else 10 * self.idle_s
            if limit is not None and now - opened.used > limit:
                del self._open[version]
                opened.index.close()
        idle = [v for v in idle if v in self._open]
        while len(self._open) > self.max_versions and idle:
            version = min(idle, key=lambda v: self._open[v].used)
            idle.remove(version)
            self._open.pop(version).index.close()

    def open(self, version: str) -> dict[str, Any]:
        """Open ``version`` (the ingress calls this before serving it): its fields, live and total rows."""
        with self._using(version, serving=True) as index:
            return {"fields": sorted(index.fields), "count": len(index), "total_rows": index.total_rows}

    def release(self, version: str) -> None:
        """The ingress no longer serves ``version``: closed once idle (a request may still be on its way)."""
        with self._lock:
            opened = self._open.get(version)
            if opened is not None:
                opened.released = True

    def loaded(self) -> list[str]:
        with self._lock:
            return sorted(self._open)

    # -- reading -------------------------------------------------------------------------------------------

    def search(self, version: str, queries: np.ndarray, k: int, allowed: np.ndarray | None) -> Results:
        with self._using(version) as index:
            return index.search(queries, k, allowed)

    def search_exact(self, version: str, queries: np.ndarray, k: int, allowed: np.ndarray | None) -> Results:
        with self._using(version) as index:
            return index.search_exact(queries, k, allowed)

    def filter_rows(self, version: str, filters: dict[str, Any]) -> np.ndarray:
        with self._using(version) as index:
            return index.filter_rows(filters)

    def items(self, version: str, rows: Sequence[int]) -> list[dict[str, Any]]:
        with self._using(version) as index:
            return index.items([int(r) for r in rows])

    def row_of(self, version: str, item_id: str) -> int | None:
        with self._using(version) as index:
            return index.row_of(item_id)

    def rerank_tokens(self, version: str, rows: np.ndarray) -> np.ndarray:
        with self._using(version) as index:
            return index.rerank_tokens(rows)

    def embeddings(self, version: str, rows: np.ndarray) -> np.ndarray:
        with self._using(version) as index:
            return index.embeddings(rows)

    def __del__(self) -> None:
        for opened in getattr(self, "_open", {}).values():
            opened.index.close()
