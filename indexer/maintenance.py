"""Operations on an index that encode nothing: ``delete`` writes a new version with items marked deleted
(the large files are hard links to the parent's; of a sharded version, only the owning shards' metadata is
written, ``indexer.sharded``), ``rollback`` publishes an older version (sharded or not). Both run under
the index lock (``indexer.staging``); ``delete`` stages its version through ``store.version.writer`` like
every
writer.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from ccrk_settings import Settings
from indexer import disk
from indexer.build_key import without_key
from indexer.errors import BuildError
from indexer.parent import read_parent
from indexer.pipeline import Operation, utc_now
from indexer.report import BuildReport
from indexer.sharded import rewrite_shards
from indexer.staging import index_lock
from store.layout import MANIFEST_FILE, METADATA_FILE, index_dir
from store.version import versions
from store.version.manifest import IndexManifest
from store.version.versions import GateRecord
from store.version.writer import Finished


def delete(name: str, ids: Sequence[str], *, settings: Settings) -> BuildReport:
    """Mark items deleted in a new version (gone from results at once; compacted by the next full build).
    Unknown or already deleted ids are an error and nothing is published."""
    started = time.perf_counter()
    root = settings.index_root
    if not ids:
        raise BuildError("no id given to delete")
    with index_lock(root, name) as guard:
        parent = read_parent(root, name)
        pm, parent_dir, parent_count, rows = parent.manifest, parent.path, parent.count, parent.rows[0]
        live = parent.live()
        unknown = [i for i in ids if i not in live]
        if unknown:
            raise BuildError(
                f"cannot delete from {name!r}: unknown or already deleted id(s) "
                f"{', '.join(map(repr, unknown[:20]))}; nothing was published"
            )
        report = BuildReport("delete", name, None, False)
        op = Operation(root, name, settings, guard, report, started)
        if parent.sharded:
            by_shard: dict[int, set[int]] = {}
            for item_id in ids:
                shard, row = live[item_id]
                by_shard.setdefault(shard, set()).add(row)
            done, manifest = rewrite_shards(op, parent, by_shard, started)
            return _deleted(report, done, manifest, len(set(ids)))
        doomed = {live[i][1] for i in ids}
        # The large files are hard links: only the metadata is written again.
        meta_bytes = (parent_dir / METADATA_FILE).stat().st_size
        need = disk.SpaceNeed({"metadata": meta_bytes, "manifest": disk.MANIFEST_BYTES})
        with op.new_version(need, f"the deletion from {name!r}") as writer:
            writer.link_from(parent_dir, [f for f in pm.checksums if f != METADATA_FILE])
            writer.write_metadata(
                (row, item_id, path, fields, deleted or row in doomed)
                for row, item_id, path, fields, deleted in rows
            )
            manifest = dataclasses.replace(
                pm,
                version=writer.version,
                created_at=utc_now(),
                count=parent_count - len(doomed),
                skipped=[],
                parent_version=pm.version,
                checksums={},
                build_params=without_key(pm.build_params),
            )
            manifest.build_seconds = round(time.perf_counter() - started, 3)
            done = writer.finish(manifest, keep=settings.keep_versions)
        return _deleted(report, done, manifest, len(doomed))


def _deleted(report: BuildReport, done: Finished, manifest: IndexManifest, deleted: int) -> BuildReport:
    report.version, report.pruned = done.version, done.pruned
    report.published = True
    report.items_indexed = deleted
    report.fill_from(manifest)
    report.build_seconds = manifest.build_seconds
    return report


def rollback(name: str, *, settings: Settings, to: str | None = None, force: bool = False) -> BuildReport:
    """Publish ``to``, or the newest version before CURRENT that the quality gate did not refuse. A refused
    ``to`` is published only with ``force`` (it was never approved)."""
    root = settings.index_root
    with index_lock(root, name):
        kept = versions.list_versions(root, name)
        current = versions.current_version(root, name)
        if to is None:
            older = kept[: kept.index(current)] if current in kept else []
            # Unreadable manifests are skipped too: rollback must land on a version known to be good.
            candidates = [v for v in older if versions.version_approved(root, name, v)]
            if not candidates:
                refused = [v for v in older if v not in candidates]
                raise BuildError(
                    f"index {name!r} has no version before {current} to roll back to (kept: {kept}"
                    + (f"; refused by the quality gate: {refused}" if refused else "")
                    + ")"
                )
            to = candidates[-1]
        elif to not in kept:
            raise BuildError(f"index {name!r} has no version {to!r} (kept: {', '.join(kept) or 'none'})")
        manifest = IndexManifest.load(index_dir(root, name) / to / MANIFEST_FILE)
        verdict = GateRecord.of(manifest)
        forced = verdict is not None and verdict.refused
        if forced and not force:
            reasons = "; ".join(verdict.reasons)
            raise BuildError(
                f"version {to} of {name!r} was refused by the quality gate and never published"
                + (f" ({reasons})" if reasons else "")
                + "; CURRENT is unchanged. Use --force to publish it anyway"
            )
        versions.publish_version(root, name, to)
    report = BuildReport("rollback", name, to, True)
    report.notes.append(f"CURRENT was {current}")
    if forced:
        report.notes.append(f"{to} was refused by the quality gate: published with --force")
    report.fill_from(manifest)
    return report
