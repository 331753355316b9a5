"""One writer per index, and what a failed build, add or delete leaves behind: no staged version, no
trash. After a crash the shard work folders with shards stay (a re-run resumes from them without encoding
again); after a full disk they go too, since leftovers would keep the disk full (an outside test saw 26 MB
of them keep it at 100 %). A failure caused by a full disk becomes a ``DiskSpaceError`` saying what could
not be written, the space needed and free, that CURRENT is unchanged, and what was removed
(``indexer.disk.explain_failure``).

The lock lives here, not in the store: it must cover a whole operation, from reading CURRENT and encoding
shards (the indexer's work folders, unknown to the store) to pruning, and what a failure keeps is indexer
policy. ``store.version.writer.VersionWriter`` removes its own staged version; this cleans up after
everything else.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from indexer import disk
from indexer.errors import BuildError
from store.layout import builds_dir, index_dir, is_version_name
from store.version.versions import current_version


@dataclass
class Guard:
    """What the operation tells its failure handler: the space it estimated last (for the message)."""

    need: disk.SpaceNeed | None = None


def remove_stale(builds: Path) -> None:
    """Remove staged versions, trash, and the temp files of shard writers killed mid-write (named by host
    and pid, so never overwritten) under ``NAME/.builds``: their writers are gone (the caller holds the
    index lock; a Ray job's actors die with their driver)."""
    for path in builds.iterdir():
        if path.is_dir() and (is_version_name(path.name) or path.name.startswith("trash-")):
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_dir() and path.name.startswith(("build-", "add-")):
            for tmp in (path / "shards").glob(".shard-*.tmp"):
                tmp.unlink(missing_ok=True)


def remove_unfinished(builds: Path) -> list[Path]:
    """Remove staged versions, trash, and work folders without a shard under ``NAME/.builds``; returns
    the work folders kept."""
    remove_stale(builds)
    kept: list[Path] = []
    for path in sorted(builds.iterdir()):
        if path.is_dir() and path.name.startswith(("build-", "add-")):
            if any((path / "shards").glob("shard-*.npz")):
                kept.append(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
    return kept


@contextlib.contextmanager
def cleaned_on_failure(root: Path, name: str) -> Iterator[Guard]:
    """Run an operation on index ``name``; on any failure, clean up (the caller holds the index lock)
    and explain a full disk."""
    base = index_dir(root, name)
    guard = Guard()
    try:
        yield guard
    except BaseException as exc:
        kept = remove_unfinished(builds_dir(root, name))  # first: the message reports the space free after
        freed = 0
        if disk.is_disk_full(exc):
            for folder in kept:
                freed += disk.tree_bytes(folder)
                shutil.rmtree(folder, ignore_errors=True)
            kept = []
        current = current_version(root, name)
        explained = disk.explain_failure(exc, base, guard.need, current, kept, freed)
        if explained is None:
            raise
        raise explained from exc


@contextlib.contextmanager
def index_lock(root: Path, name: str) -> Iterator[Guard]:
    """One writer per index at a time (a second build fails fast; the lock dies with its process). A
    failure inside leaves no staged version behind, and a full disk becomes a DiskSpaceError that says
    what was needed and kept (``cleaned_on_failure``)."""
    builds = builds_dir(root, name)
    builds.mkdir(parents=True, exist_ok=True)
    with open(builds / "lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BuildError(f"another build, add or delete is running on index {name!r}") from None
        # Staged versions and trash of writers that died mid-way (we hold the lock: none is running).
        remove_stale(builds)
        with cleaned_on_failure(root, name) as guard:
            yield guard
