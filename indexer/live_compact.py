"""``ccrk index compact``: the live catalogue's change log (``store.live``) folded into one new version.

Two ways, by what the log holds after CURRENT's ``live_sequence``:

    patches, deletes   CURRENT with them applied (the ``LiveOverlay`` a server applies), written as a new
                       version: changed fields and deleted rows in its metadata, every other file a hard link
                       to CURRENT's (``_write``; ``indexer.sharded.rewrite_shards`` for a sharded version)
    upserts too        a new product's vectors are not in the log (each server embeds it), so the compaction
                       is a build (``indexer.build.build_catalogue``) of the catalogue that CURRENT and the
                       log describe together (``read_catalogue``): CURRENT's live products (their photos and
                       fields as the version holds them) with the log's changes over them, the upserted ones
                       with the photos the write stored (``store.live.photos``), in the order a server serves
                       them. The build keeps CURRENT's searched text fields, shards, storage type and
                       synonyms and reuses every vector CURRENT holds (same photo bytes, same text values):
                       only the upserted products are encoded

Either version records the log's sequence it holds, and ``fold_published`` drops those entries from the log.
A change the build could not hold stops the catalogue before it (it and what follows stay in the log,
served from the overlay, said in the report): an upserted product without a photo (a build's row is a
photo), or one whose stored photo is missing; CURRENT's own photos missing from their paths (the build
would drop those products) leave the upserts to a build from a manifest, and only the patches and deletes
before the first one are folded.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ccrk_settings import Settings
from indexer import disk
from indexer.build import build_catalogue
from indexer.build_key import without_key
from indexer.errors import BuildError
from indexer.live_fold import applied_changes, by_shard, fold_published, open_log
from indexer.parent import read_parent
from indexer.pipeline import Operation, utc_now
from indexer.report import BuildReport
from indexer.sharded import rewrite_shards
from indexer.sources import SourceItem, SourceScan
from indexer.staging import index_lock
from store.errors import ChangeLogError, IndexUnreachableError, PhotoUnreadableError
from store.layout import METADATA_FILE
from store.live import ChangeLog, Delete, Patch, Upsert
from store.live.overlay import Snapshot, merged
from store.live.photos import PhotoStore
from store.opening import open_version
from store.shards.sharded import ShardedIndex
from store.version.metadata import read_metadata
from store.version.sharding import Sharding
from store.version.versions import current_version


@dataclass
class Catalogue:
    """The products CURRENT and the log's changes up to ``upto`` describe, and the build options of
    CURRENT that a build of them keeps."""

    version: str  # CURRENT when read
    items: list[SourceItem]
    upto: int  # the last change held
    upserts: int  # upserted products the catalogue holds (not deleted after)
    text_fields: list[str]
    shards: int
    rerank_dtype: str
    stopped: str  # why the catalogue stops before the log's last change ("" when it does not)


def _current_products(base: Any) -> dict[str, SourceItem] | str:
    """CURRENT's live products by id, in row order; or why a build cannot hold them all (a photo missing)."""
    shards = list(base.shards) if isinstance(base, ShardedIndex) else [base]
    offsets = list(base.offsets) if isinstance(base, ShardedIndex) else [0]
    rows = [
        (offsets[s] + row, item_id, path, fields)
        for s, shard in enumerate(shards)
        for row, item_id, path, fields, deleted in read_metadata(shard.path / METADATA_FILE)
        if not deleted
    ]
    channels = base.products
    photos = channels.photo_paths([r for r, *_ in rows]) if channels is not None else {}
    out: dict[str, SourceItem] = {}
    for row, item_id, path, fields in rows:
        if path is None or not Path(path).is_file():
            return f"the photo of {item_id!r} is not at {path!r}, where CURRENT was built from"
        further = [p for p in photos.get(row, [])[1:] if p != path]
        gone = next((p for p in further if not Path(p).is_file()), None)
        if gone is not None:
            return f"a further photo of {item_id!r} is not at {gone!r}, where CURRENT was built from"
        out[item_id] = SourceItem(item_id, Path(path), dict(fields), extra_paths=tuple(map(Path, further)))
    return out


def read_catalogue(root: Path, name: str, opened: ChangeLog, last: int) -> Catalogue | str:
    """CURRENT of index ``name`` with the log's changes up to ``last`` over it; or why no build can hold
    CURRENT's products."""
    stored = PhotoStore(root, name)
    with open_version(root, name) as base:
        manifest = base.manifest
        products = _current_products(base)
        if isinstance(products, str):
            return products
        channels = base.products
        text_fields = list(channels.info.fields) if channels is not None else []  # in CURRENT's order
        sharding = Sharding.from_dict(manifest.sharding) if manifest.is_sharded else None
    shards = 1 if sharding is None or sharding.segmented else sharding.shard_count
    upto, upserted, stopped = int(manifest.live_sequence), set[str](), ""
    for entry in opened.iter_changes(upto, upto=last):
        change = entry.change
        if isinstance(change, Upsert):
            try:
                paths = [stored.path_of(ref) for ref in change.photos]
            except PhotoUnreadableError as exc:
                paths, why = [], str(exc)
            else:
                why = "it has no photo" if not paths else ""
            missing = next((p for p in paths if not p.is_file()), None)
            if why or missing is not None:
                why = why or f"its stored photo {missing} is missing"
                stopped = f"change {entry.seq} upserts {change.id!r}, which a build cannot hold ({why})"
                break
            # Appended, as a server appends it to its delta (a replaced product leaves its row).
            products.pop(change.id, None)
            products[change.id] = SourceItem(
                change.id, paths[0], {**change.fields, **change.text}, extra_paths=tuple(paths[1:])
            )
            upserted.add(change.id)
        elif isinstance(change, Delete):
            products.pop(change.id, None)
            upserted.discard(change.id)
        elif isinstance(change, Patch) and change.id in products:
            # Text fields are refused on PATCH by the service (an upsert changes them): fields only.
            item = products[change.id]
            products[change.id] = dataclasses.replace(item, fields=merged(item.fields, change.fields))
        upto = entry.seq
    return Catalogue(
        manifest.version,
        list(products.values()),
        upto,
        len(upserted),
        text_fields,
        shards,
        str(manifest.rerank["dtype"]),
        stopped,
    )


def compact(name: str, *, settings: Settings, model_dir: Path | None = None) -> BuildReport:
    """Fold every change of index ``name``'s log into a new version (published), and empty the log of
    them. Nothing pending: nothing is published (the log's folded entries are still dropped)."""
    started = time.perf_counter()
    root = settings.index_root
    report = BuildReport("compact", name, None, False)
    catalogue: Catalogue | None = None
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
                snap, start, offsets, upto = applied_changes(root, name, opened, last)
                if upto < last:  # an upsert: a build of the catalogue folds it
                    read = read_catalogue(root, name, opened, last)
                    if isinstance(read, str):
                        report.notes.append(
                            f"change {upto + 1} upserts a product, and {read}: it and the {last - upto - 1} "
                            "change(s) after it stay in the log (served as they are) until a build from a "
                            "manifest holding the product"
                        )
                    elif read.upto > upto:
                        catalogue = read
                    else:
                        report.notes.append(f"{read.stopped}: it and the changes after it stay in the log")
        except (ChangeLogError, IndexUnreachableError) as exc:
            raise BuildError(
                f"cannot read the change log of {name!r}: {exc}; nothing was published"
            ) from None
        if catalogue is None:
            if upto <= start:
                report.notes.append(f"nothing pending: CURRENT holds every change up to sequence {start}")
            else:
                if snap.not_applied:
                    report.notes.append(
                        f"{snap.not_applied} change(s) this release cannot apply (text fields of patches) "
                        "were left out, as servers leave them out"
                    )
                report = _write(name, settings, guard, report, snap, offsets, upto, started)
    if catalogue is not None:
        report = _build(name, settings, catalogue, model_dir, started)
    fold_published(root, name, settings, report)
    return report


def _build(
    name: str, settings: Settings, catalogue: Catalogue, model_dir: Path | None, started: float
) -> BuildReport:
    """The build of ``catalogue`` with CURRENT's options, reported as the compaction."""
    options = settings.model_copy(
        update={
            "text_fields": catalogue.text_fields,
            "index_shards": catalogue.shards,
            "rerank_dtype": catalogue.rerank_dtype,
        }
    )
    report = build_catalogue(
        name,
        SourceScan(catalogue.items),
        settings=options,
        live_sequence=catalogue.upto,
        expect_current=catalogue.version,
        model_dir=model_dir,
    )
    report.operation = "compact"
    report.build_seconds = round(time.perf_counter() - started, 3)
    report.notes.append(
        f"folded the changes up to sequence {catalogue.upto} by a build of the catalogue they describe "
        f"({catalogue.upserts} upserted product(s) in it; every photo and text CURRENT holds reused)"
    )
    if catalogue.stopped:
        report.notes.append(f"{catalogue.stopped}: it and the changes after it stay in the log")
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
    hidden_shard, hidden_local = by_shard(snap.hidden, offsets)
    changed = np.asarray(sorted(snap.fields), np.int64)
    changed_shard, changed_local = by_shard(changed, offsets)
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
