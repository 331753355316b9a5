"""Sharded versions: which shard owns an item (the hash rule), and the ``sharding`` block of a sharded
version's manifest (format 2) that lists its shards.

A sharded version ``NAME/<version>/`` holds ``manifest.json`` and ``shard-000/ ... shard-{S-1}/``, each an
ordinary format-1 version folder (its own manifest with its own file checksums, ``index.faiss``,
``embeddings.npy``, re-rank store, ``metadata.sqlite``), so that one shard can be opened and served alone
as ``IndexVersion(path, manifest)``. Item ``id`` lives in shard ``shard_of(id, S)``:

    int.from_bytes(hashlib.blake2b(id.encode("utf-8")).digest()[:8], "big") % S

(the first 8 bytes of the 64-byte BLAKE2b digest of the id's UTF-8 bytes, read big-endian, modulo S), a
rule every process and language computes alike, unlike Python's ``hash()``. ``add`` and ``delete`` touch
only the owning shards. The version's global rows are shard offset + local row, the offsets being the
cumulative ``total_rows`` of the shards in order (``store.shards.sharded.ShardedIndex``).

Rule ``segments`` (``SEGMENT_RULE``): the folders are segments written by successive builds, not hash
shards (``indexer.segments``). A segment's rows of items changed or removed since are marked deleted in
its metadata (tombstones); an id is live in at most one segment, which is found by asking each
(``owner`` returns None). The layout is otherwise the same, so the readers and the Ray shards serve it
unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from store.errors import IndexFormatError
from store.version.exact import sorted_distinct

SHARD_RULE = "blake2b-first8-be-mod"
SHARD_RULE_TEXT = 'int.from_bytes(hashlib.blake2b(id.encode("utf-8")).digest()[:8], "big") % shard_count'
SEGMENT_RULE = "segments"
SEGMENT_RULE_TEXT = "segments written by successive builds; an id is live in at most one of them"
RULES = {SHARD_RULE: SHARD_RULE_TEXT, SEGMENT_RULE: SEGMENT_RULE_TEXT}
MAX_SHARDS = 1024
SHARD_KEY = "shard"  # build_params key of a shard's manifest: {"index": i, "of": S}


def shard_of(item_id: str, shard_count: int) -> int:
    """The shard that owns ``item_id`` among ``shard_count`` shards (``SHARD_RULE``)."""
    digest = hashlib.blake2b(item_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shard_count


def shard_dir_name(index: int) -> str:
    """``shard-000``: the folder of shard ``index`` inside its version folder."""
    return f"shard-{index:03d}"


@dataclass
class ShardEntry:
    """One shard as the version's manifest records it (the shard's own manifest has the full story)."""

    dir: str
    count: int  # live items
    total_rows: int  # rows in its files, deleted ones included
    manifest_sha256: str  # sha256 of the shard's manifest.json, which carries its files' checksums
    index_factory: str = ""
    search_params: dict[str, Any] = field(default_factory=dict)
    measured_recall_at_10: float | None = None
    recall_measured_on: int = 0


@dataclass
class Sharding:
    """The ``sharding`` block of a format-2 manifest: the rule, the shards in order, and recall@10 of the
    merged results (ANN over all shards against exact search over all shards)."""

    shards: list[ShardEntry]
    rule: str = SHARD_RULE
    rule_text: str = SHARD_RULE_TEXT
    merged_recall_at_10: float | None = None
    merged_recall_measured_on: int = 0

    @property
    def shard_count(self) -> int:
        return len(self.shards)

    @property
    def segmented(self) -> bool:
        """Whether the folders are build segments (``SEGMENT_RULE``), not hash shards."""
        return self.rule == SEGMENT_RULE

    def owner(self, item_id: str) -> int | None:
        """The shard that must hold ``item_id`` (the hash rule); None for segments: any may."""
        return None if self.segmented else shard_of(item_id, self.shard_count)

    def offsets(self) -> np.ndarray:
        """(S,) int64: the global row of each shard's local row 0."""
        totals = np.array([s.total_rows for s in self.shards], dtype=np.int64)
        return np.concatenate([[0], np.cumsum(totals)[:-1]]).astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        shards = data.pop("shards")
        return {"shard_count": self.shard_count, **data, "shards": shards}

    @classmethod
    def from_dict(cls, data: Any) -> Sharding:
        """The block as a manifest holds it; IndexFormatError when malformed or of an unknown rule."""
        if not isinstance(data, dict) or not isinstance(data.get("shards"), list):
            raise IndexFormatError("the manifest's sharding block lacks its list of shards")
        rule = data.get("rule")
        if rule not in RULES:
            raise IndexFormatError(f"unknown sharding rule {rule!r} (this code knows {', '.join(RULES)})")
        known = {f.name for f in fields(ShardEntry)}
        try:
            # Unknown keys come from newer writers of the same format: ignored, as in the manifest.
            shards = [
                ShardEntry(**{k: v for k, v in entry.items() if k in known}) for entry in data["shards"]
            ]
        except (TypeError, AttributeError) as exc:
            raise IndexFormatError(f"malformed shard entry in the sharding block: {exc}") from None
        if not 1 <= len(shards) <= MAX_SHARDS or data.get("shard_count", len(shards)) != len(shards):
            raise IndexFormatError(
                f"the sharding block lists {len(shards)} shards, shard_count says {data.get('shard_count')}"
            )
        if [s.dir for s in shards] != [shard_dir_name(i) for i in range(len(shards))]:
            raise IndexFormatError(
                f"shard folders {[s.dir for s in shards]} are not shard-000, shard-001, ..."
            )
        return cls(
            shards=shards,
            rule=str(rule),
            rule_text=str(data.get("rule_text", RULES[str(rule)])),
            merged_recall_at_10=data.get("merged_recall_at_10"),
            merged_recall_measured_on=int(data.get("merged_recall_measured_on", 0)),
        )


def partition(ids: Sequence[str], shard_count: int) -> np.ndarray:
    """(n,) int64: the owning shard of each id."""
    return np.fromiter((shard_of(i, shard_count) for i in ids), dtype=np.int64, count=len(ids))


def locate(rows: np.ndarray, offsets: np.ndarray, totals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard, local row) of each global row; IndexFormatError for a row outside every shard."""
    rows = np.asarray(rows, dtype=np.int64).ravel()
    shard = np.searchsorted(offsets, rows, side="right") - 1  # empty shards share the next one's offset
    shard = np.clip(shard, 0, len(offsets) - 1)
    local = rows - offsets[shard]
    bad = (rows < 0) | (local >= totals[shard])
    if bad.any():
        raise IndexFormatError(f"rows out of range 0..{int(totals.sum()) - 1}: {rows[bad][:5].tolist()}")
    return shard, local


def split_allowed(
    allowed_rows: np.ndarray | Sequence[int] | None, offsets: np.ndarray, totals: np.ndarray
) -> list[np.ndarray | None]:
    """Each shard's part of a filter's allowed global rows, as sorted unique local rows (empty where the
    shard holds none of them); None for every shard when nothing is filtered."""
    if allowed_rows is None:
        return [None] * len(offsets)
    allowed = sorted_distinct(allowed_rows)
    return [
        allowed[(allowed >= offset) & (allowed < offset + total)] - offset
        for offset, total in zip(offsets, totals, strict=True)
    ]
