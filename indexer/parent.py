"""The version an ``add`` or ``delete`` starts from, sharded or not, read once under the index lock: its
manifest, its shards' manifests and folders (one, the version itself, when unsharded) and their metadata;
and the metadata rows of an ``add`` (the parent's, then the new items)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from indexer.sources import SourceItem
from store.layout import METADATA_FILE
from store.opening import open_version
from store.shards.sharded import ShardedIndex
from store.version.manifest import IndexManifest
from store.version.metadata import MetadataRow, read_metadata


@dataclass
class ParentVersion:
    manifest: IndexManifest  # the version's own (format 2 when sharded)
    path: Path
    count: int  # live items
    total_rows: int
    shard_manifests: list[IndexManifest]  # [manifest] when unsharded
    shard_dirs: list[Path]  # [path] when unsharded
    rows: list[list[MetadataRow]]  # per shard, by row

    @property
    def sharded(self) -> bool:
        return self.manifest.is_sharded

    def live(self) -> dict[str, tuple[int, int]]:
        """{id: (shard, local row)} of the live items."""
        return {
            item_id: (shard, row)
            for shard, rows in enumerate(self.rows)
            for row, item_id, _, _, deleted in rows
            if not deleted
        }

    def file_bytes(self, name: str) -> int:
        """Total size of file ``name`` over the shards (e.g. the index, the metadata)."""
        return sum((d / name).stat().st_size for d in self.shard_dirs)


def read_parent(root: Path, name: str, *, expect_fingerprint: str | None = None) -> ParentVersion:
    """CURRENT of index ``name``, read whole (ModelMismatchError when built with another model)."""
    with open_version(root, name, expect_fingerprint=expect_fingerprint) as opened:
        shards = list(opened.shards) if isinstance(opened, ShardedIndex) else [opened]
        return ParentVersion(
            manifest=opened.manifest,
            path=opened.path,
            count=len(opened),
            total_rows=opened.total_rows,
            shard_manifests=[s.manifest for s in shards],
            shard_dirs=[s.path for s in shards],
            rows=[read_metadata(s.path / METADATA_FILE) for s in shards],
        )


def appended_metadata(
    rows: Sequence[MetadataRow], new_items: Sequence[SourceItem], first_row: int
) -> Iterator[MetadataRow]:
    """An ``add``'s metadata: the parent's rows, then the new items from row ``first_row`` on. A deleted
    id added again gets a new row; the old row keeps a distinct id."""
    readded = {it.id for it in new_items}
    for row, item_id, path, fields, deleted in rows:
        yield (
            row,
            (f"{item_id}#deleted@{row}" if deleted and item_id in readded else item_id),
            path,
            fields,
            deleted,
        )
    for offset, it in enumerate(new_items):
        yield first_row + offset, it.id, str(it.path), it.fields, False
