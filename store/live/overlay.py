"""The live catalogue over a served version: what the change log's entries after the version did to its
products, applied in sequence order, and the view searches read through.

``LiveOverlay`` applies entries (one applier per served version: the service's feed) and publishes each
result as an immutable ``Snapshot``; ``LiveIndex`` is the served version with the latest snapshot over it,
so filters, sort, facets, hits and ``row_of`` see the live state, and every other call reaches the version
as it is. A snapshot is built from the version and the log alone, so every process serving the version
applies the same entries to the same state (Qdrant's and Vespa's rule: partial updates are an overlay on
immutable segments, not edits of them).

What an entry does to a product of the version (named by its id):

    patch   its fields: each named field takes the new value, a field set to null is removed (JSON merge
            patch, RFC 7396, at the top level); a patch of a product that is gone does nothing
    delete  it is hidden: searches, filters, ``row_of`` and the counts leave it out
    upsert  the whole product, as a new row after the version's (``store.live.delta``: embedded by the
            overlay's ``ProductEmbedder``); the row it replaces (the version's, or an earlier upsert's) is
            hidden. Without an embedder (a fold, which leaves upserts in the log), or when its photos cannot
            be read, it is counted in ``Snapshot.not_applied``; so is a patch's text fields
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from store.live.delta import Delta, DeltaRows, ProductEmbedder
from store.live.records import Delete, Entry, Patch, Upsert
from store.version.metadata import fields_match, kind_of

log = logging.getLogger(__name__)

Fields = Mapping[str, Any]


class BaseIndex(Protocol):
    """What the overlay reads of a served version (an ``IndexVersion``, a ``ShardedIndex``, a remote one)."""

    @property
    def total_rows(self) -> int: ...

    @property
    def fields(self) -> set[str]: ...

    def __len__(self) -> int: ...

    def row_of(self, item_id: str) -> int | None: ...

    def items(self, rows: Sequence[int]) -> list[dict[str, Any]]: ...

    def filter_rows(self, filters: dict[str, Any]) -> np.ndarray: ...

    def live_mask(self) -> np.ndarray | None: ...

    def search(
        self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def search_exact(
        self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def embeddings(self, rows: np.ndarray) -> np.ndarray: ...

    def rerank_tokens(self, rows: np.ndarray) -> np.ndarray: ...


NO_ROWS = np.zeros(0, np.int64)
MATCHING_KEPT = 256  # filters whose changed rows a snapshot keeps
BASE_FILTER_ROWS = 4_000_000  # rows of the version's own filter results kept (32 MB of int64)


@dataclass(frozen=True)
class Snapshot:
    """The live state after every entry up to ``applied`` (immutable: a search reads one throughout).

    Attributes:
        applied: the last sequence number applied (the version's own when nothing is).
        hidden: the version's rows deleted since, sorted.
        changed: the version's rows whose fields changed since (and are not hidden), sorted.
        fields: each changed row's fields now (whole, as the version's ``items`` gives them, without id and
            path).
        names: the field names the changed rows hold.
        live: the version's live mask less the hidden rows (None when nothing is hidden).
        not_applied: entries this release read and could not apply (upserts, text of patches).
        last_committed_at: the commit time of the last entry applied (0: none), what apply lag reads.
    """

    applied: int
    hidden: np.ndarray = field(default_factory=lambda: NO_ROWS)
    changed: np.ndarray = field(default_factory=lambda: NO_ROWS)
    fields: Mapping[int, Fields] = field(default_factory=dict)
    names: frozenset[str] = frozenset()
    live: np.ndarray | None = None
    not_applied: int = 0
    last_committed_at: float = 0.0
    kinds: Mapping[str, frozenset[str]] = field(default_factory=dict)  # of the values patches gave
    delta: Delta | None = None  # the products upserted since the version (None: none)
    # id -> its newest upserted row (shared with the overlay, which only adds to it: a row past this
    # snapshot's delta is not shown by it)
    delta_ids: Mapping[str, int] = field(default_factory=dict, repr=False)
    # The changed rows matching a filter (by its canonical JSON), found once per snapshot: a filter shops
    # send on every query (in stock) costs a dict look-up, not a match per changed row. Bounded.
    _matching: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    # An earlier snapshot's ``_matching`` and the rows whose state changed since it, sorted (None: none):
    # a filter it found is found here by matching those rows only, so the first search after a write does
    # not match every changed row again (9 ms at 10k pending).
    _since: tuple[dict[str, np.ndarray], np.ndarray] | None = field(default=None, repr=False, compare=False)

    @property
    def empty(self) -> bool:
        return not self.hidden.size and not self.changed.size

    def changed_matching(self, filters: dict[str, Any]) -> np.ndarray:
        """The changed rows whose fields now match every filter (``store.version.metadata.fields_match``),
        sorted."""
        key = json.dumps(filters, sort_keys=True, default=str)
        found = self._matching.get(key)
        if found is not None:
            return found
        earlier = self._since[0].get(key) if self._since is not None else None
        if earlier is not None:
            moved = self._since[1]  # type: ignore[index]
            now = [
                row
                for row in moved.tolist()
                if row in self.fields and fields_match(self.fields[row], filters)
            ]
            found = union(without(earlier, moved), np.asarray(now, np.int64))
        else:
            found = np.asarray(
                [row for row in self.changed.tolist() if fields_match(self.fields[row], filters)], np.int64
            )
        if len(self._matching) >= MATCHING_KEPT:
            self._matching.clear()
        self._matching[key] = found
        return found


@dataclass(frozen=True)
class Applied:
    """What one ``LiveOverlay.apply`` did: the snapshot it published, the rows whose state changed (what a
    cache of rows must forget) and how many entries named no product of the version."""

    snapshot: Snapshot
    rows: np.ndarray
    entries: int
    skipped: int


def merged(fields: Fields, patch: Fields) -> dict[str, Any]:
    """``fields`` with ``patch`` over them: a new value replaces the old, None removes the field."""
    out = dict(fields)
    for name, value in patch.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


class LiveOverlay:
    """The entries applied over one served version (thread-safe; entries are applied in sequence order,
    and one already applied is skipped, so a page read twice does nothing the second time)."""

    def __init__(self, base: BaseIndex, applied: int = 0, embedder: ProductEmbedder | None = None) -> None:
        self.base = base
        self.embedder = embedder
        self._delta: DeltaRows | None = None
        self._delta_ids: dict[str, int] = {}
        self._lock = threading.Lock()
        self._hidden: set[int] = set()
        self._fields: dict[int, dict[str, Any]] = {}
        self._names: set[str] = set()
        self._kinds: dict[str, set[str]] = {}  # field -> the kinds of value patches gave it (only grow)
        self._rows: dict[str, int | None] = {}  # the version's row of an id (None: not in it)
        self._not_applied = 0
        self.snapshot = Snapshot(applied=applied)

    def _row(self, item_id: str) -> int | None:
        """The row of ``item_id`` (the version's, or its newest upsert's) while it is not hidden."""
        if item_id not in self._rows:
            self._rows[item_id] = self.base.row_of(item_id)
        row = self._rows[item_id]
        return None if row is None or row in self._hidden else row

    def _fields_of(self, row: int) -> dict[str, Any]:
        current = self._fields.get(row)
        if current is not None:
            return current
        (item,) = self.base.items([row])
        return {k: v for k, v in item.items() if k not in ("id", "path")}

    def apply(self, entries: Iterable[Entry]) -> Applied:
        """Apply the entries after the snapshot's ``applied`` and publish the new snapshot."""
        with self._lock:
            applied = self.snapshot.applied
            committed_at = self.snapshot.last_committed_at
            touched: set[int] = set()
            changed_now: set[int] = set()  # rows whose fields this apply changed
            hid = grew = False
            count = skipped = 0
            for entry in entries:
                if entry.seq <= applied:
                    continue
                applied, committed_at = entry.seq, entry.committed_at
                count += 1
                change = entry.change
                if isinstance(change, Upsert):
                    row = self._upsert(change, touched, changed_now)
                    grew = grew or row is not None
                    continue
                row = self._row(change.id)
                if row is None:
                    skipped += 1
                    continue
                touched.add(row)
                if isinstance(change, Delete):
                    self._hidden.add(row)
                    self._fields.pop(row, None)
                    hid = True
                elif isinstance(change, Patch):
                    if change.text:
                        self._not_applied += 1
                    if change.fields:
                        self._fields[row] = merged(self._fields_of(row), change.fields)
                        self._names.update(self._fields[row])
                        for name, value in change.fields.items():
                            kind = kind_of(value)
                            if kind is not None:
                                self._kinds.setdefault(name, set()).add(kind)
                        changed_now.add(row)
            self.snapshot = self._publish(applied, committed_at, hid, changed_now, grew, touched)
            return Applied(self.snapshot, np.array(sorted(touched), np.int64), count, skipped)

    def _upsert(self, change: Upsert, touched: set[int], changed_now: set[int]) -> int | None:
        """Embed the product and append it as a new row (hiding the row it replaces); its row, or None when
        it cannot be applied (counted)."""
        if self.embedder is None:
            self._not_applied += 1
            return None
        try:
            product = self.embedder.embed(change)
        except Exception as exc:  # one unreadable product must not stop the log's later writes
            log.warning("upsert of %r not applied: %s", change.id, exc)
            self._not_applied += 1
            return None
        if self._delta is None:
            dim = product.photo_embeds.shape[-1] if product.photo_embeds.size else self._embed_dim(product)
            self._delta = DeltaRows(
                self.base.total_rows,
                int(dim),
                _visual_dim(self.base, product),
                _token_shape(self.base, product),
            )
        old = self._row(change.id)
        if old is not None:
            self._hidden.add(old)
            self._fields.pop(old, None)
            touched.add(old)
        row = self._delta.add(change.id, product)
        self._rows[change.id] = row
        self._delta_ids[change.id] = row
        self._fields[row] = {**change.fields, **change.text}
        self._names.update(self._fields[row])
        for name, value in self._fields[row].items():
            kind = kind_of(value)
            if kind is not None:
                self._kinds.setdefault(name, set()).add(kind)
        touched.add(row)
        changed_now.add(row)
        return row

    def _embed_dim(self, product: Any) -> int:
        if product.text_embeds.size:
            return int(product.text_embeds.shape[-1])
        return int(self.base.embeddings(np.zeros(1, np.int64)).shape[-1])

    def _publish(
        self,
        applied: int,
        committed_at: float,
        hid: bool,
        changed_now: set[int],
        grew: bool,
        touched: set[int],
    ) -> Snapshot:
        """The next snapshot: the sorted arrays merged with this apply's rows (not sorted again whole), the
        fields copied (a snapshot never changes under a search)."""
        old = self.snapshot
        moved = np.fromiter(sorted(touched), np.int64, len(touched))
        since = None
        if old._matching:
            since = (old._matching, moved)
        elif old._since is not None:
            since = (old._since[0], union(old._since[1], moved))
        live, hidden, changed = old.live, old.hidden, old.changed
        if changed_now:
            changed = union(changed, np.fromiter(changed_now, np.int64, len(changed_now)))
        delta = self._delta.delta() if grew and self._delta is not None else old.delta
        if hid or grew:
            hidden = np.array(sorted(self._hidden), np.int64)
            changed = without(changed, hidden)
            base_live = self.base.live_mask()
            live = np.ones(self.base.total_rows, bool) if base_live is None else base_live.copy()
            if delta is not None:
                more = np.zeros(delta.capacity, bool)
                more[: delta.count] = True
                live = np.concatenate([live, more])
            live[hidden] = False
        if since is not None and since[1].size * 2 > changed.size:  # as dear as matching every changed row
            since = None
        return Snapshot(
            applied=applied,
            hidden=hidden,
            changed=changed,
            fields=dict(self._fields),
            names=frozenset(self._names),
            live=live,
            not_applied=self._not_applied,
            last_committed_at=committed_at,
            kinds={name: frozenset(kinds) for name, kinds in self._kinds.items()},
            delta=delta,
            delta_ids=self._delta_ids,
            _since=since,
        )


def _visual_dim(base: BaseIndex, product: Any) -> int | None:
    """The width of the delta's visual vectors: the version's (None where it has none apart)."""
    channels = getattr(base, "products", None)
    if channels is None or channels.visual is None:
        return None
    return int(channels.visual.vectors.shape[1])


def _token_shape(base: BaseIndex, product: Any) -> tuple[int, int] | None:
    """The re-rank tokens' shape where the version keeps a re-rank store (None: it keeps none)."""
    if getattr(base, "rerank_rows", None) is None or not base.total_rows:
        return None
    if product.tokens is not None:
        return tuple(product.tokens.shape)  # type: ignore[return-value]
    return tuple(base.rerank_tokens(np.zeros(1, np.int64)).shape[1:])  # type: ignore[return-value]


def union(rows: np.ndarray, more: np.ndarray) -> np.ndarray:
    """The sorted distinct rows of both (``np.union1d``, which hashes them: 0.4 ms for 6k rows, where a sort
    of the two, mostly in order already, takes a tenth of it)."""
    if not more.size:
        return rows
    out = np.concatenate([rows, more])
    out.sort()
    return out[np.concatenate([[True], out[1:] != out[:-1]])] if out.size else out


def without(rows: np.ndarray, drop: np.ndarray) -> np.ndarray:
    return rows[~np.isin(rows, drop, assume_unique=False)] if drop.size and rows.size else rows
