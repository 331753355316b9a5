"""What an index operation reports: ``BuildReport`` (printed by the CLI, returned to callers and tests)
and the one-line descriptions of a skipped item and of stored rows that failed their checksum."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from store.version.manifest import IndexManifest


@dataclass
class BuildReport:
    """What an operation did; printed by the CLI as a summary, also returned to callers and tests."""

    operation: str
    name: str
    version: str | None
    published: bool
    items_total: int = 0
    items_indexed: int = 0
    count: int = 0
    resumed_shards: int = 0
    shards: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    ignored_files: int = 0
    skipped_links: list[dict[str, str]] = field(default_factory=list)  # symlinks not followed (sources)
    already_indexed: int = 0
    already_current: bool = False  # a build whose result CURRENT holds already: nothing was done
    index_factory: str = ""
    search_params: dict[str, Any] = field(default_factory=dict)
    measured_recall_at_10: float | None = None
    language_recall_at_10: dict[str, float] = field(default_factory=dict)
    rerank_bytes_per_image: int = 0
    encode_seconds: float = 0.0
    build_seconds: float = 0.0
    pruned: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gate: dict[str, Any] | None = None  # quality gate verdict (indexer.quality_gate), when on
    index_shards: int = 1  # shards of the version (``store.version.sharding``); 1: unsharded
    engine: str = "local"  # where the shards were encoded: local, or ray (``indexer.ray_encoding``)
    encode_nodes: dict[str, int] = field(default_factory=dict)  # engine ray: shards encoded per node id
    # A full build that reuses stored vectors (``indexer.incremental``): items encoded and reused, and the
    # sources against CURRENT (ids new, ids whose image bytes changed, live ids removed).
    items_encoded: int = 0
    items_reused: int = 0
    items_new: int = 0
    items_changed: int = 0
    items_removed: int = 0
    reuse_mismatched: list[str] = field(default_factory=list)  # ids whose stored row failed its checksum
    # Product channels (``indexer.product_reuse``): photos and text values reused from CURRENT's channels
    # and encoded by this build (a first photo encoded for its main row counts as encoded).
    photos_reused: int = 0
    photos_encoded: int = 0
    texts_reused: int = 0
    texts_encoded: int = 0
    ann_index: str = ""  # built, rebuilt from stored vectors, or linked from the parent

    @property
    def items_per_second(self) -> float:
        if self.operation == "build":
            fresh = self.items_encoded
        else:
            fresh = self.items_total if self.operation != "add" else self.items_indexed
        return fresh / self.encode_seconds if self.encode_seconds > 0 else 0.0

    def fill_from(self, manifest: IndexManifest) -> None:
        """The published (or kept) version's figures, from its manifest."""
        self.count = manifest.count
        self.index_factory = manifest.index_factory
        self.search_params = manifest.search_params
        self.measured_recall_at_10 = manifest.measured_recall_at_10
        self.language_recall_at_10 = manifest.language_recall_at_10
        self.rerank_bytes_per_image = int(manifest.rerank["bytes_per_image"])
        shards = manifest.sharding.get("shards", [])
        self.index_shards = max(1, len(shards))
        if shards:  # each shard has its own tuned parameters
            self.search_params = {"per_shard": [s.get("search_params", {}) for s in shards]}


def describe_skipped(entry: dict[str, str]) -> str:
    """'manifest.jsonl:4 (img/x.jpg): truncated: ...', or 'folder/x.jpg: truncated: ...' for folders."""
    path = entry.get("path")
    where = entry["source"] if path in (None, entry["source"]) else f"{entry['source']} ({path})"
    return f"{where}: {entry['reason']}"


MISMATCHES_SHOWN = 10  # names a mismatch note lists; more are "..."


def mismatch_note(rows: str, parent_version: str | None, names: Sequence[str], separator: str) -> str:
    """The note on stored rows of ``parent_version`` that failed their checksum and were encoded again
    (the main rows', ``indexer.incremental``, or the product channels', ``indexer.product_reuse``):
    '3 stored row(s) of V failed their checksum and were encoded again: a, b, c'. ``rows`` names them
    ('stored row(s)'), ``names`` are the rows as the note lists them, joined by ``separator``."""
    listed = separator.join(names[:MISMATCHES_SHOWN])
    more = " ..." if len(names) > MISMATCHES_SHOWN else ""
    head = f"{len(names)} {rows} of {parent_version} failed their checksum and were encoded again"
    return f"{head}: {listed}{more}"
