"""Every photo of a product catalogue's items as a version's product channels hold them
(``store.products.channels.PhotoRows``), with their content digests: a photo whose file bytes are those of a
photo
of the parent's channels keeps its stored vectors (``indexer.product_reuse``), a first photo this build
encoded for its main row takes them from the build's own shards, and only the others are encoded here."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ccrk_settings import Settings
from indexer import encoding
from indexer.product_reuse import ENCODE, MAIN, STORED, FirstPhotos, ProductReuse, plan_photos
from indexer.product_rows import grouped_photos
from indexer.report import BuildReport
from indexer.shards import ShardStore
from indexer.sources import SourceItem
from model.model_dir import ModelConfig
from store.products.channels import PhotoRows


def _shard_arrays(store: ShardStore) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    oks, embeds, visual = [], [], []
    for i in range(store.count):
        shard = store.read(i)
        oks.append(shard.ok)
        embeds.append(shard.embeds)
        visual.append(
            shard.visual if shard.visual is not None else np.zeros((shard.embeds.shape[0], 0), np.float32)
        )
    return oks, embeds, visual


def photo_rows(
    items: Sequence[SourceItem],
    main: ShardStore,
    work_dir: Path,
    model_dir: Path,
    settings: Settings,
    cfg: ModelConfig,
    report: BuildReport,
    rows: np.ndarray | None = None,
    *,
    first: FirstPhotos | None = None,
    reuse: ProductReuse | None = None,
) -> PhotoRows:
    """Every photo of the items (``items`` are the build's decoded items; their version rows are ``rows``,
    default their positions), with their content digests: a photo found in the parent's channels
    (``reuse``) keeps its stored vectors, a first photo this build encoded (``first.encoded``, default all:
    in the order of ``main``) takes them from the build's own shards, the others are encoded here."""
    first = first or FirstPhotos(np.ones(len(items), bool))
    oks, embeds, visual = _shard_arrays(main)
    encoded_first = int(first.encoded.sum())
    found = sum(int(e.shape[0]) for e in embeds)
    if found != encoded_first or sum(int(ok.sum()) for ok in oks) != encoded_first:
        raise ValueError(f"internal: {found} encoded rows for {encoded_first} items")
    plan = plan_photos(items, first, reuse)
    main_pos = np.full(len(items), -1, np.int64)
    main_pos[first.encoded] = np.arange(encoded_first)
    todo = np.flatnonzero(plan.source == ENCODE)
    # Pools of vectors: the main shards' first photos, the photos encoded here, the parent's; each kept
    # photo takes one row of their concatenation.
    pools_e, pools_v = list(embeds), list(visual)
    pick = np.full(len(plan.paths), -1, np.int64)
    is_main = plan.source == MAIN
    pick[is_main] = main_pos[plan.item[is_main]]
    base = encoded_first
    if todo.size:
        extra = [
            SourceItem(
                id=f"{plan.item[m]}:{plan.k[m]}", path=plan.paths[m], source=items[plan.item[m]].source
            )
            for m in todo.tolist()
        ]
        # Its own work folder per photo list and the files' contents (their digests, taken above): a resumed
        # build reuses only shards of these very photos, not those of a file replaced meanwhile.
        key = hashlib.sha256(
            "\n".join(
                f"{it.id}\t{it.path}\t{plan.digests[m].tobytes().hex()}"
                for it, m in zip(extra, todo.tolist(), strict=True)
            ).encode()
        ).hexdigest()[:16]
        encoded, _ = encoding.encode(
            extra, work_dir / f"photos-{key}", model_dir, settings, cfg, "fp16", None
        )
        _, x_embeds, x_visual = _shard_arrays(encoded.store)
        pools_e.extend(x_embeds)
        pools_v.extend(x_visual)
        good = {it.id for it in encoded.ok_items}
        ok = np.array([it.id in good for it in extra], bool)
        pick[todo[ok]] = base + np.arange(int(ok.sum()))
        base += int(ok.sum())
        if encoded.skipped:
            report.notes.append(
                f"{len(encoded.skipped)} of {len(extra)} product photos could not be decoded and are "
                "not searched (their products are): " + "; ".join(s["reason"] for s in encoded.skipped[:5])
            )
    from_stored = np.flatnonzero(plan.source == STORED)
    if from_stored.size:
        assert reuse is not None and reuse.stored is not None
        s_embeds, s_visual = reuse.stored.photo_vectors(plan.stored_row[from_stored])
        pools_e.append(s_embeds)
        pools_v.append(s_visual if s_visual is not None else np.zeros((s_embeds.shape[0], 0), np.float32))
        pick[from_stored] = base + np.arange(from_stored.size)
    full = [i for i, e in enumerate(pools_e) if e.shape[0]]
    widths = {int(pools_v[i].shape[1]) for i in full}
    if len(widths) > 1:
        raise ValueError(f"internal: photos with visual embeddings of widths {sorted(widths)}")
    kept = np.flatnonzero(pick >= 0)
    if not full:
        raise ValueError("internal: a product catalogue without a photo")
    vectors = np.concatenate([pools_e[i] for i in full])[pick[kept]]
    vis = np.concatenate([pools_v[i] for i in full])[pick[kept]] if widths != {0} else None
    if reuse is not None:
        reuse.photos_reused += int(from_stored.size)
        reuse.photos_carried += int(np.unique(plan.stored_row[from_stored]).size)
        reuse.photos_encoded += int(kept.size - from_stored.size)
    row_of = np.arange(len(items), dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
    # Grouped by product, its photos in manifest order.
    return grouped_photos(
        PhotoRows(
            row_of[plan.item[kept]],
            [str(plan.paths[m]) for m in kept.tolist()],
            vectors,
            vis,
            plan.digests[kept],
            plan.stats[kept],
        )
    )
