"""Folding the live catalogue's change log (``store.live``) into versions.

Every version records the last sequence number it holds (``IndexManifest.live_sequence``), and a server
applies only the changes after it. Two ways a version comes to hold changes:

    compact      ``ccrk index compact`` (``indexer.live_compact``): CURRENT with every change up to the log's
                 last sequence applied, as a new version
    full build   ``ccrk index build`` from a manifest supersedes the changes made before it started: it
                 records the log's last sequence at its start (``start_sequence``), and the changes made
                 while it ran (after that sequence) apply over it, so a write racing the build is neither
                 lost nor applied twice

Versions derived from CURRENT (``ccrk index add``, ``delete``) hold what CURRENT holds. Once a version is
published, ``fold_published`` records the fold in the log and drops the entries it holds
(``ChangeLog.fold_upto``, ``truncate_upto``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ccrk_settings import Settings
from indexer.report import BuildReport
from store.errors import ChangeLogError, IndexFormatError, IndexUnreachableError
from store.layout import MANIFEST_FILE, index_dir
from store.live import ChangeLog, Upsert, changelog_path, open_changelog
from store.live.overlay import LiveOverlay, Snapshot
from store.opening import open_version
from store.shards.sharded import ShardedIndex
from store.version.manifest import IndexManifest
from store.version.versions import current_version, list_versions

log = logging.getLogger(__name__)

PAGE = 1_000  # entries applied at a time


def open_log(root: Path, name: str, dsn: str | None) -> ChangeLog | None:
    """Index ``name``'s change log; None for an embedded log with no file (nothing was ever written)."""
    if not dsn and not changelog_path(root, name).is_file():
        return None
    return open_changelog(root, name, dsn)


def start_sequence(root: Path, name: str, settings: Settings, report: BuildReport) -> int:
    """The sequence a full build starting now holds: the log's last one (0 without a log). A log that cannot
    be read leaves it at CURRENT's own (the changes after it apply over the new version: kept, not lost),
    with a note saying so."""
    try:
        opened = open_log(root, name, settings.live_dsn)
        if opened is None:
            return 0
        with opened:
            return opened.last_sequence()
    except (ChangeLogError, IndexUnreachableError) as exc:
        held = _current_sequence(root, name)
        report.notes.append(
            f"the change log could not be read ({exc}): the product writes after sequence {held} will apply "
            "over this version instead of being superseded by it"
        )
        return held


def _current_sequence(root: Path, name: str) -> int:
    if current_version(root, name) is None:
        return 0
    try:
        with open_version(root, name) as opened:
            return int(opened.manifest.live_sequence)
    except IndexFormatError:
        return 0


def _oldest_kept_sequence(root: Path, name: str) -> int:
    """The smallest ``live_sequence`` among the index's kept versions (0 when one cannot be read)."""
    held = []
    for version in list_versions(root, name):
        try:
            manifest = IndexManifest.load(index_dir(root, name) / version / MANIFEST_FILE)
            held.append(int(manifest.live_sequence))
        except IndexFormatError:
            return 0
    return min(held, default=0)


def fold_published(root: Path, name: str, settings: Settings, report: BuildReport) -> None:
    """After a publish: record that CURRENT holds the changes up to its ``live_sequence`` and drop them from
    the log. A log that cannot be written keeps them (a server skips them anyway: the version says it holds
    them), noted in the report; the next fold drops them."""
    held = _current_sequence(root, name)
    if held <= 0:
        return
    try:
        opened = open_log(root, name, settings.live_dsn)
        if opened is None:
            return
        with opened:
            opened.fold_upto(held)
            # Dropped only up to what every kept version holds: a process still serving an older one (its
            # swap pending, a rollback) must find the entries after its own sequence.
            dropped = opened.truncate_upto(min(held, _oldest_kept_sequence(root, name)))
        if dropped:
            report.notes.append(f"folded {dropped} product write(s) of the change log, up to sequence {held}")
    except (ChangeLogError, IndexUnreachableError, ValueError) as exc:
        report.notes.append(f"the change log keeps the writes up to {held} for now ({exc})")


def applied_changes(
    root: Path, name: str, opened: ChangeLog, upto: int
) -> tuple[Snapshot, int, list[int], int]:
    """CURRENT's snapshot after the changes up to ``upto``, or up to the first upsert before it (a new
    product is folded by a build that encodes it: ``indexer.live_compact``); CURRENT's ``live_sequence``,
    the shard offsets, and the sequence of the last change applied."""
    with open_version(root, name) as base:
        start = int(base.manifest.live_sequence)
        overlay = LiveOverlay(base, applied=start)
        page = []
        for entry in opened.iter_changes(start, upto=upto):
            if isinstance(entry.change, Upsert):
                upto = entry.seq - 1
                break
            page.append(entry)
            if len(page) >= PAGE:
                overlay.apply(page)
                page = []
        overlay.apply(page)
        snap = overlay.snapshot
        offsets = list(base.offsets) if isinstance(base, ShardedIndex) else [0]
    return snap, start, offsets, upto


def by_shard(rows: np.ndarray, offsets: list[int]) -> tuple[np.ndarray, np.ndarray]:
    shard = np.searchsorted(np.asarray(offsets), rows, side="right") - 1
    return shard, rows - np.asarray(offsets)[shard]
