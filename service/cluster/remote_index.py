"""``RemoteShardedIndex``: one sharded version as a ``store.version.reader.SearchableIndex`` whose shards are
served
apart (one Ray Serve deployment per shard, ``service.cluster.shard.ShardServer``), for the ingress's index
holder in place of ``store.shards.sharded.ShardedIndex``.

A search sends every shard its request first and then collects the answers: one parallel hop, merged by
``store.shards.merge.merge_topk`` with the offsets of the version's manifest (the same merge, so the same
answers
as ``ShardedIndex``). Items and re-rank tokens are asked only of the shards owning the merged rows. Every
call names the version, so one answer never mixes versions. Closing releases the version on every shard.

A version's product channels (``store.products.channels``: beside the shards, over the global rows) are
opened here,
in the ingress, as ``ShardedIndex.products`` (the hybrid path reads them in-process; the shards serve the
main rows, items and re-rank tokens as for any version); their rows deleted (``live_mask``) are read once from
the shards' metadata files, beside the channels.

Retries: all shard calls are reads, so a call that fails because the replica answering it died (or became
unreachable) is sent again, up to ``retries`` times; Ray Serve's router drops a dead replica and routes the
retry to another one. A replica's death costs no failed request when the shard has another live replica
(``num_replicas`` >= 2) and no more than ``retries`` of a shard's replicas die under one call. A call that
still fails, or times out, raises ``IndexUnreachableError`` (503 at the edge; a version that failed to open
so is tried again at the next poll).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from store.errors import IndexFormatError, IndexUnreachableError
from store.layout import MANIFEST_FILE, METADATA_FILE, index_dir
from store.products.channels import ProductChannels, has_product_channels
from store.shards.merge import merge_topk
from store.version.manifest import IndexManifest, check_model
from store.version.metadata import MetadataReader, filter_sql
from store.version.reader import check_queries
from store.version.sharding import ShardEntry, Sharding, locate, split_allowed

Results = tuple[np.ndarray, np.ndarray]


class Pending(Protocol):
    def result(self, timeout_s: float | None = None) -> Any: ...


# call(shard, method, *args) -> Pending: sends one request to a replica of that shard's deployment.
ShardCall = Callable[..., Pending]


class RemoteShardedIndex:
    """Thread-safe: every call is independent (the handles are)."""

    def __init__(
        self,
        path: Path,
        manifest: IndexManifest,
        call: ShardCall,
        *,
        shard_count: int,
        retries: int = 2,
        timeout_s: float = 30.0,
        open_timeout_s: float = 120.0,
        retry_on: tuple[type[BaseException], ...] = (),
        unreachable_on: tuple[type[BaseException], ...] = (),
    ) -> None:
        if not manifest.is_sharded:
            raise IndexFormatError(f"{path} is not a sharded version")
        self.path = Path(path)
        self.manifest = manifest
        self.sharding = Sharding.from_dict(manifest.sharding)
        if self.sharding.shard_count != shard_count:
            raise IndexFormatError(
                f"{path} has {self.sharding.shard_count} shards; the Ray Serve app was started with "
                f"{shard_count} shard deployments (`ccrk serve --engine ray` deploys again for it; after "
                "`serve deploy`, set args.index_shards to the new count in the config and deploy it again)"
            )
        self._call = call
        self.retries = retries
        self.timeout_s = timeout_s
        self.open_timeout_s = open_timeout_s  # opening waits for replicas still starting, and loads files
        self.retry_on = retry_on  # a replica died: sent again, to another one
        self.unreachable_on = unreachable_on  # other failures of the engine: IndexUnreachableError (503)
        self._offsets = self.sharding.offsets()
        self._totals = np.array([e.total_rows for e in self.sharding.shards], dtype=np.int64)
        # Every shard opens the version now (a swap loads it everywhere before it serves), says what it has.
        opened = self._all([("open", ())] * shard_count)
        for i, info in enumerate(opened):
            if int(info["total_rows"]) != int(self._totals[i]):
                raise IndexFormatError(
                    f"shard {i} of {path} holds {info['total_rows']} rows, the manifest {self._totals[i]}"
                )
        self._counts = [int(info["count"]) for info in opened]
        self._shard_fields = [set(info["fields"]) for info in opened]
        self._fields = set().union(*self._shard_fields)
        self._closed = False
        self._kinds: dict[str, frozenset[str]] = {}
        self._kinds_lock = threading.Lock()
        self.products: ProductChannels | None = None
        self._live: np.ndarray | None = None
        if has_product_channels(self.path):
            try:
                self.products = ProductChannels(self.path, self.total_rows)
                if sum(self._counts) != self.total_rows:
                    self._live = self._read_live()
            except BaseException:
                self.close()
                raise

    def _read_live(self) -> np.ndarray:
        """(total_rows,) bool, False for the rows the shards' metadata marks deleted."""
        live = np.ones(self.total_rows, bool)
        for entry, offset, total in zip(self.sharding.shards, self._offsets, self._totals, strict=True):
            with self._metadata(entry) as meta:
                gone = meta.deleted_rows()
            live[offset + gone[(gone >= 0) & (gone < total)]] = False
        return live

    def _metadata(self, entry: ShardEntry) -> contextlib.closing[MetadataReader]:
        """A shard's metadata file, read here (the shared file system) rather than asked of its replicas."""
        return contextlib.closing(MetadataReader(self.path / entry.dir / METADATA_FILE))

    # -- calls ---------------------------------------------------------------------------------------------

    def _send(self, shard: int, method: str, args: tuple) -> Pending:
        return self._call(shard, method, self.version, *args)

    def _wait(self, shard: int, method: str, args: tuple, pending: Pending) -> Any:
        timeout_s = self.open_timeout_s if method == "open" else self.timeout_s
        for attempt in range(self.retries + 1):
            try:
                return pending.result(timeout_s=timeout_s)
            except TimeoutError as exc:  # Ray's GetTimeoutError too: a slow shard is not retried (load)
                cancel = getattr(pending, "cancel", None)
                if cancel is not None:
                    cancel()
                raise IndexUnreachableError(
                    f"shard {shard} of {self.version} did not answer {method} within {timeout_s:g} s"
                ) from exc
            except self.retry_on as exc:
                if attempt >= self.retries:
                    raise IndexUnreachableError(
                        f"shard {shard} of {self.version}: {method} failed on {attempt + 1} replicas: {exc}"
                    ) from exc
                pending = self._send(shard, method, args)
            except IndexFormatError:
                raise  # the shard's own answer (a bad filter, a broken file): Ray re-raises it as such
            except self.unreachable_on as exc:  # the engine's other failures: no replica, back pressure...
                raise IndexUnreachableError(
                    f"shard {shard} of {self.version}: {method} failed: {exc}"
                ) from exc
        raise AssertionError("unreachable")

    def _one(self, shard: int, method: str, args: tuple) -> Any:
        return self._wait(shard, method, args, self._send(shard, method, args))

    def _all(self, calls: Sequence[tuple[str, tuple] | None]) -> list[Any]:
        """Call ``calls[i]`` (method, args) on shard i, all sent before any answer is awaited; None: skip."""
        sent = [None if c is None else self._send(i, c[0], c[1]) for i, c in enumerate(calls)]
        return [
            None if c is None or p is None else self._wait(i, c[0], c[1], p)
            for i, (c, p) in enumerate(zip(calls, sent, strict=True))
        ]

    # -- SearchableIndex -----------------------------------------------------------------------------------

    @property
    def version(self) -> str:
        return self.manifest.version

    def __len__(self) -> int:
        return sum(self._counts)

    @property
    def total_rows(self) -> int:
        return int(self._totals.sum())

    @property
    def fields(self) -> set[str]:
        return set(self._fields)

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(int(o) for o in self._offsets)

    def _fan_out(self, method: str, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None) -> Results:
        q = check_queries(queries, k, self.manifest.embed_dim)
        calls: list[tuple[str, tuple] | None] = []
        for i, local in enumerate(split_allowed(allowed_rows, self._offsets, self._totals)):
            empty = self._counts[i] == 0 or (local is not None and local.size == 0)
            calls.append(None if empty else (method, (q, k, local)))
        answers = self._all(calls)
        scores, rows = [], []
        for answer in answers:
            if answer is None:
                answer = (np.zeros((q.shape[0], 0), np.float32), np.zeros((q.shape[0], 0), np.int64))
            scores.append(answer[0])
            rows.append(answer[1])
        return merge_topk(scores, rows, self._offsets, k)

    def search(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None) -> Results:
        return self._fan_out("search", queries, k, allowed_rows)

    def search_exact(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None) -> Results:
        return self._fan_out("search_exact", queries, k, allowed_rows)

    def filter_rows(self, filters: dict[str, Any]) -> np.ndarray:
        filter_sql(filters, self._fields)  # unknown fields and malformed conditions raise FilterError here
        calls = [("filter_rows", (filters,)) if set(filters) <= f else None for f in self._shard_fields]
        parts = [
            np.asarray(rows, np.int64) + int(offset)
            for rows, offset in zip(self._all(calls), self._offsets, strict=True)
            if rows is not None
        ]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def field_kinds(self, name: str) -> set[str]:
        """The kinds of value the version's products hold in field ``name`` (``MetadataReader.field_kinds``:
        what a product write is checked against), read from the shards' metadata files beside the
        channels, as the deleted rows are; kept per field (a version never changes)."""
        with self._kinds_lock:
            held = self._kinds.get(name)
        if held is not None:
            return set(held)
        kinds: set[str] = set()
        if name in self._fields:
            for entry, fields in zip(self.sharding.shards, self._shard_fields, strict=True):
                if name in fields:
                    with self._metadata(entry) as meta:
                        kinds |= meta.field_kinds(name)
        with self._kinds_lock:
            self._kinds[name] = frozenset(kinds)
        return kinds

    def _gather(self, method: str, rows: Sequence[int] | np.ndarray) -> list[Any]:
        """``method(version, local rows)`` on each owning shard (all sent at once), in the order of rows."""
        shard_of_row, local = locate(np.asarray(rows, dtype=np.int64), self._offsets, self._totals)
        calls: list[tuple[str, tuple] | None] = [None] * len(self._totals)
        where: dict[int, np.ndarray] = {}
        for i in np.unique(shard_of_row):
            pos = np.flatnonzero(shard_of_row == i)
            where[int(i)] = pos
            calls[int(i)] = (method, (local[pos],))
        out: list[Any] = [None] * len(local)
        for i, answer in enumerate(self._all(calls)):
            if answer is not None:
                for p, value in zip(where[i], answer, strict=True):
                    out[int(p)] = value
        return out

    def items(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        return self._gather("items", [int(r) for r in rows])

    def row_of(self, item_id: str) -> int | None:
        owner = self.sharding.owner(item_id)
        for i in [owner] if owner is not None else range(len(self._totals) - 1, -1, -1):
            row = self._one(i, "row_of", (item_id,))
            if row is not None:
                return int(self._offsets[i]) + int(row)
        return None

    def rerank_tokens(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64).ravel()
        if rows.size == 0:
            return self._one(int(np.argmax(self._totals > 0)), "rerank_tokens", (rows,))
        return np.stack(self._gather("rerank_tokens", rows))

    def embeddings(self, rows: np.ndarray) -> np.ndarray:
        found = self._gather("embeddings", np.asarray(rows, dtype=np.int64).ravel())
        return np.stack(found) if found else np.zeros((0, self.manifest.embed_dim), np.float32)

    def live_mask(self) -> np.ndarray | None:
        """The product channels' mask over the global rows: (total_rows,) bool, False for deleted rows.
        None when no row is deleted, or when the version has no product channels (only their searches ask
        for it; the shards mask their own rows). Read once, when the version is opened (see the module
        docstring)."""
        return self._live

    def damage(self) -> str | None:
        """What is wrong with the local product channels' files since the open (``store.guard``; the shards
        check their own), None when nothing."""
        products = getattr(self, "products", None)
        return None if products is None else products.damage()

    def close(self) -> None:
        """Release the version on the shards (one replica of each hears it; the others close it when idle)."""
        if self._closed:
            return
        self._closed = True
        if getattr(self, "products", None) is not None:
            self.products.close()  # type: ignore[union-attr]
        for i in range(len(self._totals)):
            with contextlib.suppress(Exception):  # best effort: a replica closes an idle version itself
                self._send(i, "release", ())

    def __enter__(self) -> RemoteShardedIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remote_opener(
    call: ShardCall, shard_count: int, fallback: Callable[..., Any], **options: Any
) -> Callable[..., Any]:
    """An ``IndexHolder`` opener: a sharded version over the shard deployments, any other through
    ``fallback`` (``store.opening.open_version``: an unsharded version is read by the ingress itself)."""

    def open_version(
        root: Path, name: str, version: str | None = None, *, expect_fingerprint: str | None = None
    ) -> Any:
        if version is None:
            return fallback(root, name, version, expect_fingerprint=expect_fingerprint)
        path = index_dir(root, name) / version
        manifest = IndexManifest.load(path / MANIFEST_FILE)
        if not manifest.is_sharded:
            return fallback(root, name, version, expect_fingerprint=expect_fingerprint)
        check_model(manifest, expect_fingerprint=expect_fingerprint, expect_model_name=None)
        return RemoteShardedIndex(path, manifest, call, shard_count=shard_count, **options)

    return open_version
