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
    upsert  not applied by this release (new products need their photos and text embedded: counted in
            ``Snapshot.not_applied``, and no write route produces one yet); so is a patch's text fields
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from store.live.records import Delete, Entry, Patch, Upsert
from store.version.metadata import fields_match, filter_sql, kind_of

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


_NO_ROWS = np.zeros(0, np.int64)
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
    hidden: np.ndarray = field(default_factory=lambda: _NO_ROWS)
    changed: np.ndarray = field(default_factory=lambda: _NO_ROWS)
    fields: Mapping[int, Fields] = field(default_factory=dict)
    names: frozenset[str] = frozenset()
    live: np.ndarray | None = None
    not_applied: int = 0
    last_committed_at: float = 0.0
    kinds: Mapping[str, frozenset[str]] = field(default_factory=dict)  # of the values patches gave
    # The changed rows matching a filter (by its canonical JSON), found once per snapshot: a filter shops
    # send on every query (in stock) costs a dict look-up, not a match per changed row. Bounded.
    _matching: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def empty(self) -> bool:
        return not self.hidden.size and not self.changed.size

    def changed_matching(self, filters: dict[str, Any]) -> np.ndarray:
        """The changed rows whose fields now match every filter (``store.version.metadata.fields_match``),
        sorted."""
        key = json.dumps(filters, sort_keys=True, default=str)
        found = self._matching.get(key)
        if found is None:
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

    def __init__(self, base: BaseIndex, applied: int = 0) -> None:
        self.base = base
        self._lock = threading.Lock()
        self._hidden: set[int] = set()
        self._fields: dict[int, dict[str, Any]] = {}
        self._names: set[str] = set()
        self._kinds: dict[str, set[str]] = {}  # field -> the kinds of value patches gave it (only grow)
        self._rows: dict[str, int | None] = {}  # the version's row of an id (None: not in it)
        self._not_applied = 0
        self.snapshot = Snapshot(applied=applied)

    def _row(self, item_id: str) -> int | None:
        """The version's row of ``item_id`` while it is not hidden."""
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
            hid = False
            count = skipped = 0
            for entry in entries:
                if entry.seq <= applied:
                    continue
                applied, committed_at = entry.seq, entry.committed_at
                count += 1
                change = entry.change
                if isinstance(change, Upsert):
                    self._not_applied += 1
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
            self.snapshot = self._publish(applied, committed_at, hid, changed_now)
            return Applied(self.snapshot, np.array(sorted(touched), np.int64), count, skipped)

    def _publish(self, applied: int, committed_at: float, hid: bool, changed_now: set[int]) -> Snapshot:
        """The next snapshot: the sorted arrays merged with this apply's rows (not sorted again whole), the
        fields copied (a snapshot never changes under a search)."""
        old = self.snapshot
        live, hidden, changed = old.live, old.hidden, old.changed
        if changed_now:
            changed = np.union1d(changed, np.fromiter(changed_now, np.int64, len(changed_now)))
        if hid:
            hidden = np.array(sorted(self._hidden), np.int64)
            changed = _without(changed, hidden)
            base_live = self.base.live_mask()
            live = np.ones(self.base.total_rows, bool) if base_live is None else base_live.copy()
            live[hidden] = False
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
        )


def _without(rows: np.ndarray, drop: np.ndarray) -> np.ndarray:
    return rows[~np.isin(rows, drop, assume_unique=False)] if drop.size and rows.size else rows


class LiveIndex:
    """A served version seen through its overlay's latest snapshot. Every attribute it does not define is
    the version's own (its manifest, path, product channels, embeddings, re-rank tokens, ``close``)."""

    def __init__(self, base: BaseIndex, overlay: LiveOverlay | None = None) -> None:
        self.base = base
        self.overlay = overlay if overlay is not None else LiveOverlay(base)
        self._kinds: dict[str, set[str]] = {}
        self._kinds_lock = threading.Lock()
        self._filters: OrderedDict[str, np.ndarray] = OrderedDict()  # ``_base_rows``
        self._filter_rows = 0
        self._filters_lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        if name in ("base", "overlay"):  # not set yet (a copy, a pickle): never the version's own
            raise AttributeError(name)
        return getattr(self.base, name)

    @property
    def snapshot(self) -> Snapshot:
        return self.overlay.snapshot

    @property
    def live_sequence(self) -> int:
        """The last change-log sequence number this view shows."""
        return self.overlay.snapshot.applied

    def __len__(self) -> int:
        return len(self.base) - int(self.overlay.snapshot.hidden.size)

    @property
    def fields(self) -> set[str]:
        return self.base.fields | self.overlay.snapshot.names

    def live_mask(self) -> np.ndarray | None:
        snap = self.overlay.snapshot
        return snap.live if snap.hidden.size else self.base.live_mask()

    def row_of(self, item_id: str) -> int | None:
        row = self.base.row_of(item_id)
        hidden = self.overlay.snapshot.hidden
        if row is None or (hidden.size and hidden[min(np.searchsorted(hidden, row), hidden.size - 1)] == row):
            return None
        return row

    def items(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        found = self.base.items(rows)
        changed = self.overlay.snapshot.fields
        if not changed:
            return found
        for i, row in enumerate(rows):
            now = changed.get(int(row))
            if now is not None:
                found[i] = {**now, "id": found[i]["id"], "path": found[i]["path"]}
        return found

    def filter_rows(self, filters: dict[str, Any]) -> np.ndarray:
        """The version's matching rows less the hidden and changed ones, and the changed rows whose fields
        now match (``store.version.metadata.fields_match``: the same rule the version's SQL applies)."""
        snap = self.overlay.snapshot
        if snap.empty:
            return self._base_rows(filters)
        filter_sql(filters, self.fields)  # an unknown field or a malformed condition: FilterError
        rows = self._base_rows(filters) if set(filters) <= self.base.fields else _NO_ROWS
        rows = _without(_without(rows, snap.hidden), snap.changed)
        now = snap.changed_matching(filters)
        return np.union1d(rows, now) if now.size else rows

    def _base_rows(self, filters: dict[str, Any]) -> np.ndarray:
        """The version's own rows matching ``filters``, kept (the version never changes): a filter shops
        send on every query is one SQL scan per version, not one per query (64 ms at 100k products for
        a filter matching most of them, ``bench/live_updates.py``). At most ``BASE_FILTER_ROWS`` rows are
        kept over all filters, the oldest dropped first."""
        key = json.dumps(filters, sort_keys=True, default=str)
        with self._filters_lock:
            found = self._filters.get(key)
            if found is not None:
                self._filters.move_to_end(key)
                return found
        found = self.base.filter_rows(filters)
        found.setflags(write=False)
        with self._filters_lock:
            if key in self._filters:  # another search read it meanwhile: one entry, counted once
                return self._filters[key]
            self._filters[key] = found
            self._filter_rows += found.size
            while self._filter_rows > BASE_FILTER_ROWS and len(self._filters) > 1:
                _, dropped = self._filters.popitem(last=False)
                self._filter_rows -= dropped.size
        return found

    def field_kinds(self, name: str) -> set[str]:
        """The kinds of value field ``name`` holds now: the version's (read once per field) and those the
        patches since gave it."""
        with self._kinds_lock:
            kinds = self._kinds.get(name)
        if kinds is None:
            reader = getattr(self.base, "field_kinds", None)
            kinds = set(reader(name)) if reader is not None else set()
            with self._kinds_lock:
                self._kinds[name] = kinds
        return kinds | self.overlay.snapshot.kinds.get(name, frozenset())

    def _visible(self, allowed_rows: np.ndarray | None) -> np.ndarray | None:
        snap = self.overlay.snapshot
        if not snap.hidden.size:
            return allowed_rows
        if allowed_rows is None:
            assert snap.live is not None
            return np.flatnonzero(snap.live)
        return _without(np.asarray(allowed_rows, np.int64).ravel(), snap.hidden)

    def search(
        self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        return self.base.search(queries, k, self._visible(allowed_rows))

    def search_exact(
        self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        return self.base.search_exact(queries, k, self._visible(allowed_rows))
