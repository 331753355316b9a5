"""Encoding an operation's new items into shards (``indexer.shards``), and what comes out of it: the items
that decoded, those skipped and why, the share of bad items an operation tolerates, and the shards' rows
streamed into a version's arrays."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from ccrk_settings import Settings
from indexer.decode import DecodePool, Decoder
from indexer.errors import BuildError, TooManyBadItemsError
from indexer.report import describe_skipped
from indexer.shards import ProgressFn, ShardStore, encode_shards
from indexer.sources import SourceItem
from model.model_dir import ModelConfig
from model.runtime import Encoder, load_encoder
from store.version.writer import VersionArrays

# Runs once the encoder is loaded, before the first shard: the space check.
Preflight = Callable[[Encoder, ShardStore], None]


@dataclass
class Encoded:
    ok_items: list[SourceItem]
    skipped: list[dict[str, str]]
    store: ShardStore
    resumed: int
    seconds: float
    nodes: dict[str, int] = field(default_factory=dict)  # --engine ray: shards encoded per Ray node id


def skipped_entry(item: SourceItem, kind: str, detail: str) -> dict[str, str]:
    return {
        "id": item.id,
        "source": item.source or str(item.path),
        "path": str(item.path),
        "kind": kind,
        "reason": f"{kind}: {detail}",
    }


IN_PROCESS_DECODE_MAX = 32  # items up to this many are decoded in this process


class LazyEncoder:
    """An encoder loaded on first use. A build that encodes nothing (every row reused: a metadata-only
    change) often never needs one (measurements taken over, no gate), and loading its graphs costs
    0.15-0.3 s; whatever asks it anything loads it then."""

    def __init__(self, load: Callable[[], Encoder]) -> None:
        self._load = load
        self._encoder: Encoder | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends: not the encoder's
            raise AttributeError(name)
        if self._encoder is None:
            self._encoder = self._load()
        return getattr(self._encoder, name)


def encode(
    items: Sequence[SourceItem],
    work_dir: Path,
    model_dir: Path,
    settings: Settings,
    cfg: ModelConfig,
    rerank_dtype: str,
    progress: ProgressFn | None,
    preflight: Preflight | None = None,
) -> tuple[Encoded, Encoder]:
    """Encode ``items`` into shards under ``work_dir``; ``preflight`` runs once the encoder is loaded,
    before the first shard (the space check). ``settings.engine`` says where: this machine (decode
    workers and this process's encoder), or a Ray cluster's actors (``indexer.ray_encoding``); the shard
    files are the same."""
    store = ShardStore(work_dir, settings.shard_size, len(items))
    started = time.perf_counter()
    nodes: dict[str, int] = {}
    if settings.engine == "ray" and items:  # nothing to encode (every row reused): no cluster needed
        # The shards are encoded by the cluster's actors; this process's encoder serves what follows
        # (the space check, tuning, the gate). Imported here: the local engine never loads Ray.
        from indexer.ray_encoding import encode_shards_on_ray

        encoder = load_encoder(model_dir, settings.backend, settings.device, settings.threads, settings.int8)
        if preflight is not None:
            preflight(encoder, store)
        run = encode_shards_on_ray(
            items, store, settings=settings, model_dir=model_dir, rerank_dtype=rerank_dtype, progress=progress
        )
        resumed, nodes = run.resumed, run.nodes
    else:
        # The decode pool forks before the encoder's runtime starts its thread pools.
        # No decode workers when nothing is left to encode (a rebuild that reuses every row), nor for a
        # few items (a rebuild after a small change): forking and joining them costs more than decoding.
        workers = settings.index_workers if len(items) > IN_PROCESS_DECODE_MAX else 0
        with DecodePool(Decoder(cfg.vision, settings.max_image_pixels), workers) as pool:
            # A few items (a small rebuild): the graphs run a few times only, their threads need not spin.
            load = functools.partial(
                load_encoder,
                model_dir,
                settings.backend,
                settings.device,
                settings.threads,
                settings.int8,
                spinning=len(items) > IN_PROCESS_DECODE_MAX,
            )
            encoder = load() if items else cast(Encoder, LazyEncoder(load))
            if preflight is not None:
                preflight(encoder, store)
            resumed = encode_shards(
                items,
                store,
                encoder,
                pool,
                batch_size=settings.index_batch_size,
                rerank_dtype=rerank_dtype,
                progress=progress,
            )
    seconds = time.perf_counter() - started
    ok_items: list[SourceItem] = []
    skipped: list[dict[str, str]] = []
    for i in range(store.count):
        shard = store.read(i)
        lo, _ = store.bounds(i)
        for j, good in enumerate(shard.ok):
            item = items[lo + j]
            if good:
                ok_items.append(item)
            else:
                skipped.append(skipped_entry(item, shard.kinds[j], shard.details[j]))
    return Encoded(ok_items, skipped, store, resumed, seconds, nodes), encoder


def check_bad_share(total: int, skipped: list[dict[str, str]], limit: float, what: str) -> None:
    if total and len(skipped) / total > limit:
        kinds: dict[str, int] = {}
        for s in skipped:
            kinds[s["kind"]] = kinds.get(s["kind"], 0) + 1
        listing = "\n".join(f"  {describe_skipped(s)}" for s in skipped[:20])
        more = f"\n  ... and {len(skipped) - 20} more" if len(skipped) > 20 else ""
        raise TooManyBadItemsError(
            f"{what}: {len(skipped)} of {total} items are bad ({len(skipped) / total:.1%} > {limit:.1%}); "
            f"nothing was published. By kind: {kinds}\n{listing}{more}"
        )


def stored_token_shape(store: ShardStore) -> tuple[int, int]:
    """(T, W) of the encoded patch tokens (T == 0: a model without a re-rank store)."""
    for i in range(store.count):
        shard = store.read(i)
        if shard.ok.any():
            return int(shard.tokens.shape[1]), int(shard.tokens.shape[2])
    raise BuildError("internal: no encoded item in any shard")


def append_shards(arrays: VersionArrays, store: ShardStore) -> None:
    """Every encoded row of the shards, in order, into a version's arrays."""
    for i in range(store.count):
        shard = store.read(i)
        if shard.embeds.shape[0] == 0:
            continue
        arrays.append(shard.embeds, shard.tokens, shard.scales)


def append_shards_split(arrays: Mapping[int, VersionArrays], owners: np.ndarray, store: ShardStore) -> None:
    """Every encoded row of the shards into the arrays of the index shard that owns it (``owners``: the
    owning index shard of each encoded row, in order), keeping their order within each index shard."""
    pos = 0
    for i in range(store.count):
        shard = store.read(i)
        m = shard.embeds.shape[0]
        if m == 0:
            continue
        mine = owners[pos : pos + m]
        pos += m
        for owner in np.unique(mine):
            sel = mine == owner
            scales = None if shard.scales is None else shard.scales[sel]
            arrays[int(owner)].append(shard.embeds[sel], shard.tokens[sel], scales)
    if pos != owners.shape[0]:
        raise BuildError(f"internal: {pos} encoded rows, {owners.shape[0]} owners")
