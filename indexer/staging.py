"""What a failed build, add or delete leaves behind: no staged version, no trash. After a crash the shard
work folders with shards stay (a re-run resumes from them without encoding again); after a full disk they
go too, since leftovers would keep the disk full (an outside test saw 26 MB of them keep it at 100 %). A
failure caused by a full disk becomes a ``DiskSpaceError`` saying what could not be written, the space
needed and free, that CURRENT is unchanged, and what was removed (``indexer.disk.explain_failure``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from indexer import disk
from indexer import index_format as fmt


@dataclass
class Guard:
    """What the operation tells its failure handler: the space it estimated last (for the message)."""

    need: disk.SpaceNeed | None = None


def remove_unfinished(builds: Path) -> list[Path]:
    """Remove staged versions, trash, and work folders without a shard under ``NAME/.builds``; returns
    the work folders kept."""
    kept: list[Path] = []
    for path in sorted(builds.iterdir()):
        if not path.is_dir():
            continue
        if fmt.is_version_name(path.name) or path.name.startswith("trash-"):
            shutil.rmtree(path, ignore_errors=True)
        elif path.name.startswith(("build-", "add-")):
            if any((path / "shards").glob("shard-*.npz")):
                kept.append(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
    return kept


@contextlib.contextmanager
def cleaned_on_failure(root: Path, name: str) -> Iterator[Guard]:
    """Run an operation on index ``name``; on any failure, clean up (the caller holds the index lock)
    and explain a full disk."""
    base = fmt.index_dir(root, name)
    guard = Guard()
    try:
        yield guard
    except BaseException as exc:
        kept = remove_unfinished(base / fmt.BUILDS_DIR)  # first: the message reports the space free after
        freed = 0
        if disk.is_disk_full(exc):
            for folder in kept:
                freed += disk.tree_bytes(folder)
                shutil.rmtree(folder, ignore_errors=True)
            kept = []
        current = fmt.current_version(root, name)
        explained = disk.explain_failure(exc, base, guard.need, current, kept, freed)
        if explained is None:
            raise
        raise explained from exc


def discard_installed(root: Path, name: str, version: str) -> None:
    """Remove a version installed but never published (CURRENT could not be switched to it), so that
    nothing takes it for a good version later. Renamed first, as pruning does: never half listed."""
    base = fmt.index_dir(root, name)
    trash = base / fmt.BUILDS_DIR / f"trash-{version}"
    with contextlib.suppress(OSError):  # the publish error is the one to report
        os.rename(base / version, trash)
        shutil.rmtree(trash, ignore_errors=True)
