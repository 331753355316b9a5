"""The one way to open a version of either kind: ``open_version`` (by name, default CURRENT) and
``open_path`` (a folder and its manifest, e.g. a staged version) give an ``IndexVersion`` for an
unsharded version and a ``ShardedIndex`` for a sharded one, as the manifest says."""

from __future__ import annotations

from pathlib import Path

from store.shards.sharded import ShardedIndex
from store.version.manifest import IndexManifest
from store.version.reader import IndexVersion, open_named

# What an opener returns: a SearchableIndex with a folder (``path``) and ``close``.
OpenedIndex = IndexVersion | ShardedIndex


def open_path(path: Path, manifest: IndexManifest) -> OpenedIndex:
    """The version in folder ``path`` whose manifest is ``manifest`` (installed or staged)."""
    if manifest.is_sharded:
        return ShardedIndex(path, manifest)
    return IndexVersion(path, manifest)


def open_version(
    root: Path,
    name: str,
    version: str | None = None,
    *,
    expect_fingerprint: str | None = None,
    expect_model_name: str | None = None,
) -> OpenedIndex:
    """Open ``version`` of index ``name`` (default: the one CURRENT names), sharded or not. With
    ``expect_*``, refuse an index built with another model (ModelMismatchError naming both)."""
    return open_named(
        root,
        name,
        version,
        open_path,
        expect_fingerprint=expect_fingerprint,
        expect_model_name=expect_model_name,
    )
