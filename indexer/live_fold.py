"""Folding the live catalogue's change log (``store.live``) into versions.

Every version records the last sequence number it holds (``IndexManifest.live_sequence``), and a server
applies only the changes after it. Two ways a version comes to hold changes:

    compact      ``ccrk index compact``: CURRENT with every change up to the log's last sequence applied
                 (the same ``LiveOverlay`` a server applies), written as a new version: changed fields and
                 deleted rows in its metadata, every other file a hard link to CURRENT's
    full build   ``ccrk index build`` from a manifest supersedes the changes made before it started: it
                 records the log's last sequence at its start (``start_sequence``), and the changes made
                 while it ran (after that sequence) apply over it, so a write racing the build is neither
                 lost nor applied twice

Versions derived from CURRENT (``ccrk index add``, ``delete``) hold what CURRENT holds. Once a version is
published, ``fold_published`` records the fold in the log and drops the entries it holds
(``ChangeLog.fold_upto``, ``truncate_upto``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import numpy as np

from ccrk_settings import Settings
from indexer import disk
from indexer.build_key import without_key
from indexer.errors import BuildError
from indexer.parent import read_parent
from indexer.pipeline import Operation, utc_now
from indexer.report import BuildReport
from indexer.sharded import rewrite_shards
from indexer.staging import index_lock
from store.errors import ChangeLogError, IndexFormatError, IndexUnreachableError
from store.layout import MANIFEST_FILE, METADATA_FILE, index_dir
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


def _applied(root: Path, name: str, opened: ChangeLog, upto: int) -> tuple[Snapshot, int, list[int], int]:
    """CURRENT's snapshot after the changes up to ``upto``, or up to the first upsert before it (a new
    product is folded by a build that encodes it, not here: it and what follows stay in the log, served
    from the overlay); CURRENT's ``live_sequence``, the shard offsets, and the sequence folded."""
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


def _by_shard(rows: np.ndarray, offsets: list[int]) -> tuple[np.ndarray, np.ndarray]:
    shard = np.searchsorted(np.asarray(offsets), rows, side="right") - 1
    return shard, rows - np.asarray(offsets)[shard]


def compact(name: str, *, settings: Settings) -> BuildReport:
    """Fold every change of index ``name``'s log into a new version (published), and empty the log of
    them. Nothing pending: nothing is published (the log's folded entries are still dropped)."""
    started = time.perf_counter()
    root = settings.index_root
    report = BuildReport("compact", name, None, False)
    with index_lock(root, name) as guard:
        if current_version(root, name) is None:
            raise BuildError(f"index {name!r} has no published version to compact")
        try:
            opened = open_log(root, name, settings.live_dsn)
            if opened is None:
                report.notes.append("no change log: nothing to fold")
                return report
            with opened:
                last = opened.last_sequence()
                snap, start, offsets, upto = _applied(root, name, opened, last)
            if upto < last:
                report.notes.append(
                    f"change {upto + 1} upserts a product: it and the {last - upto - 1} change(s) after it "
                    "stay in the log (served as they are) until a build from a manifest holding the product"
                )
        except (ChangeLogError, IndexUnreachableError) as exc:
            raise BuildError(
                f"cannot read the change log of {name!r}: {exc}; nothing was published"
            ) from None
        if upto <= start:
            report.notes.append(f"nothing pending: CURRENT holds every change up to sequence {start}")
        else:
            if snap.not_applied:
                report.notes.append(
                    f"{snap.not_applied} change(s) this release cannot apply (text fields of patches) were "
                    "left out, as servers leave them out"
                )
            report = _write(name, settings, guard, report, snap, offsets, upto, started)
    fold_published(root, name, settings, report)
    return report


def _write(
    name: str,
    settings: Settings,
    guard: object,
    report: BuildReport,
    snap: Snapshot,
    offsets: list[int],
    upto: int,
    started: float,
) -> BuildReport:
    root = settings.index_root
    parent = read_parent(root, name)
    pm = parent.manifest
    hidden_shard, hidden_local = _by_shard(snap.hidden, offsets)
    changed = np.asarray(sorted(snap.fields), np.int64)
    changed_shard, changed_local = _by_shard(changed, offsets)
    doomed: dict[int, set[int]] = {}
    for shard, row in zip(hidden_shard.tolist(), hidden_local.tolist(), strict=True):
        doomed.setdefault(shard, set()).add(row)
    patched: dict[int, dict[int, dict]] = {}
    pairs = zip(changed_shard.tolist(), changed_local.tolist(), changed.tolist(), strict=True)
    for shard, row, whole in pairs:
        patched.setdefault(shard, {})[row] = dict(snap.fields[whole])
    gone = int(snap.hidden.size)
    op = Operation(root, name, settings, guard, report, started)  # type: ignore[arg-type]
    if parent.sharded:
        done, manifest = rewrite_shards(op, parent, doomed, started, patched=patched, live_sequence=upto)
    else:
        meta_bytes = (parent.path / METADATA_FILE).stat().st_size
        need = disk.SpaceNeed({"metadata": meta_bytes, "manifest": disk.MANIFEST_BYTES})
        own_doomed, own_patched = doomed.get(0, set()), patched.get(0, {})
        with op.new_version(need, f"the compaction of {name!r}") as writer:
            writer.link_from(parent.path, [f for f in pm.checksums if f != METADATA_FILE])
            writer.write_metadata(
                (row, item_id, path, own_patched.get(row, fields), deleted or row in own_doomed)
                for row, item_id, path, fields, deleted in parent.rows[0]
            )
            manifest = dataclasses.replace(
                pm,
                version=writer.version,
                created_at=utc_now(),
                count=parent.count - gone,
                skipped=[],
                parent_version=pm.version,
                checksums={},
                build_params=without_key(pm.build_params),
                live_sequence=upto,
            )
            manifest.build_seconds = round(time.perf_counter() - started, 3)
            done = writer.finish(manifest, keep=settings.keep_versions)
    report.version, report.pruned = done.version, done.pruned
    report.published = True
    report.items_indexed = gone + int(changed.size)
    report.fill_from(manifest)
    report.build_seconds = manifest.build_seconds
    report.notes.append(
        f"folded the changes after sequence {pm.live_sequence} up to {upto}: {int(changed.size)} product(s) "
        f"changed, {gone} deleted"
    )
    return report
