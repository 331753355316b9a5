"""A rebuild of a product catalogue at the cost of what changed: every photo whose file bytes are those of a
photo of CURRENT's product channels, and every text value whose (field, language, text) is one of theirs,
keeps the stored vectors (``store.product_reuse``: same reuse key, rows checked against their stored
checksums); only the others are encoded (``indexer.products``).

    open_parent     CURRENT's stored product vectors, or why there are none (no CURRENT, --force, written
                    before the digests, another model or storage options)
    plan_photos     each photo's content digest (a file with the stats recorded when it was hashed is not
                    read again) and where its vectors come from: the parent's channels, the build's own main
                    shards (a first photo encoded by this build), or the photo encoding pass
    reused_texts    each text value's stored row (or -1), checked
    taken_over_calibration
                    CURRENT's fusion calibration, while few rows changed since it was calibrated
    inputs_key      a key of everything the channels are written, tuned and calibrated from: a rebuild whose
                    key is CURRENT's takes CURRENT's channels over whole (hard links; a metadata-only change,
                    or files touched), as the main rows' arrays and index are

The counts go into the build report (``report_products``), as ``indexer.incremental.report_reuse`` does for
the main rows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indexer.fusion_calibration import CALIBRATION_CODE
from indexer.incremental import digest_and_stat
from indexer.report import BuildReport, mismatch_note
from indexer.sources import SourceItem
from store.errors import IndexFormatError
from store.layout import MANIFEST_FILE, index_dir
from store.product_reuse import StoredProductVectors, TextKey
from store.products.channels import PRODUCTS_FORMAT, PhotoRows, ProductInfo, TextRows
from store.products.hybrid import FusionModel
from store.version.manifest import IndexManifest
from store.version.reuse import DIGEST_BYTES, STAT_COLUMNS
from store.version.versions import current_version

STORED, MAIN, ENCODE = 0, 1, 2  # where a photo's vectors come from (``PhotoPlan.source``)
# The fusion is calibrated again once more than this share of the photo and text rows changed since it was
# last calibrated (the main rows' measurements follow the same rule: ``indexer.segments.REMEASURE_SHARE``).
RECALIBRATE_SHARE = 0.05


@dataclass
class ProductReuse:
    """CURRENT's reusable product vectors (None: nothing reused, ``why_not`` says why) and what was
    reused, encoded and found tampered with."""

    stored: StoredProductVectors | None
    why_not: str = ""
    parent_version: str | None = None
    parent_rows: dict[str, int] = field(default_factory=dict)  # CURRENT's live ids: their (global) rows
    photos_reused: int = 0
    photos_encoded: int = 0
    texts_reused: int = 0
    texts_encoded: int = 0
    # Distinct parent rows whose vectors were carried over: a row reused by several photos or values (equal
    # files or texts of other products) is one parent row kept, the others are changed rows.
    photos_carried: int = 0
    texts_carried: int = 0
    mismatched: list[str] = field(default_factory=list)  # 'photo PATH' / 'text FIELD of product ROW'
    # A compaction (``indexer.live_compact``): CURRENT's calibration is kept whatever changed, as its servers
    # fused the live products with it, so that the answers stay those served; the next build from a
    # manifest calibrates again once the changes since it pass ``RECALIBRATE_SHARE``.
    keep_calibration: bool = False

    def close(self) -> None:
        if self.stored is not None:
            self.stored.close()


def open_parent(
    root: Path, name: str, key: str, *, force: bool, live: dict[str, int] | None = None
) -> ProductReuse:
    """CURRENT's product channels of index ``name`` as reusable vectors under reuse key ``key``; ``live``:
    CURRENT's live ids and their rows (``indexer.incremental.ReusePlan.live``), so that a product's own
    photos and values are found first."""
    current = current_version(root, name)
    if current is None:
        return ProductReuse(None, "no published version to reuse from")
    if force:
        return ProductReuse(None, "--force: every photo and text value encoded", current)
    path = index_dir(root, name) / current
    try:
        stored = StoredProductVectors.open(path, IndexManifest.load(path / MANIFEST_FILE), key)
    except IndexFormatError as exc:
        return ProductReuse(None, f"CURRENT ({current}) cannot be read for reuse: {exc}", current)
    if stored is None:
        why = (
            f"CURRENT ({current}) holds no reusable product vectors (no product channels, written before "
            "their digests existed, or with another model or storage options): every photo and text value "
            "encoded"
        )
        return ProductReuse(None, why, current)
    return ProductReuse(stored, "", current, dict(live or {}))


@dataclass
class FirstPhotos:
    """What the version's main rows know of each item's first photo: whether this build encoded it (its
    vectors in the build's main shards, in item order), and its content digest and file stats (zeros:
    unknown), taken by the main rows' reuse plan (``indexer.incremental.plan_reuse``)."""

    encoded: np.ndarray  # (n,) bool
    digests: np.ndarray | None = None  # (n, 16) uint8
    stats: np.ndarray | None = None  # (n, 5) int64


@dataclass
class PhotoPlan:
    """Every photo of the items in (item, photo) order and where its vectors come from."""

    item: np.ndarray  # (M,) int64 the item's position
    k: np.ndarray  # (M,) int64 the photo's position among its item's (0: the first)
    paths: list[Path]
    digests: np.ndarray  # (M, 16) uint8
    stats: np.ndarray  # (M, 5) int64
    source: np.ndarray  # (M,) int8: STORED, MAIN or ENCODE
    stored_row: np.ndarray  # (M,) int64 the parent's photo row (STORED), else -1


def plan_photos(items: Sequence[SourceItem], first: FirstPhotos, reuse: ProductReuse | None) -> PhotoPlan:
    """Digest every photo and choose the source of its vectors: a parent's photo row with the same content
    digest whose stored vectors pass their checksum; else a first photo this build encoded; else encoded
    by the photo pass. Mismatched rows are named in ``reuse.mismatched``."""
    stored = reuse.stored if reuse is not None else None
    item = np.array([i for i, it in enumerate(items) for _ in range(1 + len(it.extra_paths))], np.int64)
    k = np.array([j for it in items for j in range(1 + len(it.extra_paths))], np.int64)
    paths = [p for it in items for p in (it.path, *it.extra_paths)]
    firsts = k == 0
    digests = np.zeros((len(paths), DIGEST_BYTES), np.uint8)
    stats = np.zeros((len(paths), STAT_COLUMNS), np.int64)
    if first.digests is not None:
        digests[firsts] = first.digests
        if first.stats is not None:
            stats[firsts] = first.stats
    todo = np.flatnonzero(~firsts if first.digests is not None else np.ones(len(paths), bool))
    if todo.size:
        as_items = [SourceItem(id=str(int(m)), path=paths[m]) for m in todo.tolist()]
        digests[todo], stats[todo] = digest_and_stat(as_items, stored)
    stored_row = np.full(len(paths), -1, np.int64)
    if stored is not None:
        assert reuse is not None
        keys = digests.tobytes()
        owner = [reuse.parent_rows.get(it.id, -1) for it in items]
        known = np.flatnonzero(digests.any(axis=1))
        stored_row[known] = stored.photo_rows_of(
            [keys[m * DIGEST_BYTES : (m + 1) * DIGEST_BYTES] for m in known.tolist()],
            [owner[item[m]] for m in known.tolist()],
        )
        candidates = np.unique(stored_row[stored_row >= 0])
        bad = candidates[~stored.check_photos(candidates)] if candidates.size else candidates
        if bad.size:
            hit = np.isin(stored_row, bad)
            assert reuse is not None
            reuse.mismatched += [f"photo {paths[m]}" for m in np.flatnonzero(hit).tolist()]
            stored_row[hit] = -1
    source = np.full(len(paths), ENCODE, np.int8)
    source[firsts & first.encoded[item]] = MAIN
    source[stored_row >= 0] = STORED
    return PhotoPlan(item, k, paths, digests, stats, source, stored_row)


def reused_texts(keys: Sequence[TextKey], reuse: ProductReuse | None, owners: Sequence[str]) -> np.ndarray:
    """(F,) int64: each text value's row among the parent's stored values (same field, language and text,
    the product's own (``owners``: the values' product ids) first; stored embedding passing its
    checksum), -1 where it is encoded."""
    rows = np.full(len(keys), -1, np.int64)
    if reuse is None or reuse.stored is None:
        return rows
    stored = reuse.stored
    rows[:] = stored.text_rows_of(keys, [reuse.parent_rows.get(o, -1) for o in owners])
    candidates = np.unique(rows[rows >= 0])
    bad = candidates[~stored.check_texts(candidates)] if candidates.size else candidates
    if bad.size:
        hit = np.isin(rows, bad)
        reuse.mismatched += [f"text {keys[i][0]} of {owners[i]}" for i in np.flatnonzero(hit)]
        rows[hit] = -1
    return rows


def report_products(report: BuildReport, reuse: ProductReuse) -> None:
    """The product channels' reuse figures and notes into the build report."""
    report.photos_reused, report.photos_encoded = reuse.photos_reused, reuse.photos_encoded
    report.texts_reused, report.texts_encoded = reuse.texts_reused, reuse.texts_encoded
    report.reuse_mismatched += reuse.mismatched
    report.notes.append(
        f"products: {reuse.photos_reused:,} photos and {reuse.texts_reused:,} text values reused from "
        f"{reuse.parent_version}, {reuse.photos_encoded:,} photos and {reuse.texts_encoded:,} text values "
        "encoded"
        if reuse.stored is not None
        else f"products: {reuse.photos_encoded:,} photos and {reuse.texts_encoded:,} text values encoded"
    )
    if reuse.mismatched:
        rows = "stored product vector row(s)"
        report.notes.append(mismatch_note(rows, reuse.parent_version, reuse.mismatched, "; "))
    if reuse.why_not and reuse.parent_version is not None:
        report.notes.append(f"products reuse: {reuse.why_not}")


def inputs_key(
    info: ProductInfo,
    photos: PhotoRows,
    texts: TextRows,
    products: int,
    target_recall: float,
    catalogue_order: np.ndarray | None,
) -> str:
    """The key of what a version's product channels are written, tuned and calibrated from: every photo and
    text row (owners, paths, content digests, texts, terms, vectors as stored), the searched fields, the
    product count, the recall target and the calibration's catalogue order. Equal keys: writing, tuning and
    calibrating again would find what the version holds
    (``store.products.channels.ProductInfo.inputs_key``)."""
    digest = hashlib.sha256()
    head = [
        PRODUCTS_FORMAT,
        CALIBRATION_CODE,  # a version calibrated by other code is not what calibrating now would find
        info.text_encoder,
        info.fields,
        info.text_languages,
        products,
        target_recall,
        photos.paths,
        texts.fields,
        texts.langs,
        texts.texts,
        texts.terms,
    ]
    digest.update(json.dumps(head, ensure_ascii=False).encode())
    arrays = (
        (photos.owners, np.int64),
        (photos.embeds, np.float32),
        (photos.visual, np.float32),
        (photos.digests, np.uint8),
        (texts.owners, np.int64),
        (texts.embeds, np.float32),
        (catalogue_order, np.int64),
    )
    for arr, dtype in arrays:
        if arr is None:
            digest.update(b"none;")
            continue
        stored = np.ascontiguousarray(arr, dtype=dtype)
        digest.update(json.dumps(stored.shape).encode())
        digest.update(memoryview(stored.reshape(-1).view(np.uint8)))
    return digest.hexdigest()[:16]


def fusion_usable(fusion: dict | None) -> bool:
    """Whether a parent's stored fusion may be carried forward: none (nothing calibrated), or one that
    parses. One that does not is served by reciprocal rank (``service.search.hybrid``) until a build
    calibrates again: a rebuild must not carry it forward, whether it takes the channels over whole or only
    the calibration."""
    return FusionModel.stored(fusion).problem is None


def taken_over_calibration(reuse: ProductReuse | None, info: ProductInfo) -> ProductInfo | None:
    """CURRENT's channel info when its fusion calibration may be taken over by a version of ``info``'s
    fields and languages: the same ones, and the photo and text rows changed since it was calibrated
    (not carried over from a distinct row of CURRENT's, or CURRENT's not carried over) within
    ``RECALIBRATE_SHARE`` of the rows. Calibrating costs a fixed ~600 pseudo-queries through every channel:
    a rebuild after a small change would spend most of its time there, to find nearly the same parameters.
    None: calibrate."""
    parent = reuse.stored.info if reuse is not None and reuse.stored is not None else None
    if reuse is None or parent is None or not parent.fusion or not info.texts:
        return None
    if parent.fields != info.fields:
        return None
    if parent.text_languages != info.text_languages and not reuse.keep_calibration:
        return None
    if parent.calibration_code != CALIBRATION_CODE or parent.text_encoder != info.text_encoder:
        return None  # fitted by other calibration code, or on queries another acquirer embedded
    if not fusion_usable(parent.fusion):
        return None
    # Rows not carried over from a distinct row of CURRENT's (encoded here, or a second copy of one
    # carried row), or CURRENT's rows not carried over (changed or removed): a changed row is both, once.
    photos = max(reuse.photos_encoded + reuse.photos_reused, parent.photos) - reuse.photos_carried
    texts = max(reuse.texts_encoded + reuse.texts_reused, parent.texts) - reuse.texts_carried
    changed = photos + texts
    since = parent.changed_since_calibration + changed
    if since > RECALIBRATE_SHARE * (info.photos + info.texts) and not reuse.keep_calibration:
        return None
    taken = ProductInfo(**{**parent.__dict__})
    taken.calibrated_in = parent.calibrated_in or str(reuse.parent_version)
    taken.changed_since_calibration = since
    return taken
