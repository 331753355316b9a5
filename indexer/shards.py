"""Sharded encoding with resume: the unit of work (and of resume after ``kill -9``) is one shard file.

A build's work folder is ``INDEX_ROOT/NAME/.builds/build-<plan hash>/``; the plan hash covers the items
(ids, paths, metadata), the model fingerprint and the storage options, so re-running the same command
finds the same folder and encodes only the shards that are not there yet. A shard is written to a temp
file and renamed into place, so a killed build leaves only complete shards behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.decode import DecodePool, DecodeResult
from indexer.sources import SourceItem
from model.runtime import Encoder
from store.files import names_full_disk

ProgressFn = Callable[[int, int], None]  # (items done, items total)


def plan_hash(
    items: Sequence[SourceItem], *, fingerprint: str, rerank_dtype: str, shard_size: int, max_pixels: int
) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps([fingerprint, rerank_dtype, shard_size, max_pixels]).encode())
    encode = _PLAN_JSON.encode
    for item in items:
        digest.update(encode([item.id, str(item.path), item.fields]).encode())
        digest.update(b"\n")
    return digest.hexdigest()[:16]


# json.dumps(..., sort_keys=True, default=str), without building an encoder per item: the same text.
_PLAN_JSON = json.JSONEncoder(sort_keys=True, default=str)


def quantize_tokens(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 with one scale per token vector (max |x| / 127): 2x smaller than fp16, error <= scale / 2."""
    scales = np.abs(tokens).max(axis=-1) / 127.0
    scales = np.where(scales > 0, scales, 1.0).astype(np.float32)
    q = np.clip(np.rint(tokens / scales[..., None]), -127, 127).astype(np.int8)
    return q, scales


@dataclass
class Shard:
    """One shard as read back: ok mask over its items, arrays for the ok ones, reasons for the bad ones."""

    index: int
    ok: np.ndarray  # (n,) bool
    embeds: np.ndarray  # (n_ok, D) float32
    tokens: np.ndarray  # (n_ok, T, W) float16 or int8
    scales: np.ndarray | None  # (n_ok, T) float32 with int8
    kinds: list[str]  # per item: "" when ok
    details: list[str]
    visual: np.ndarray | None = None  # (n_ok, V) float32: a model's visual embeddings, when it has them


class ShardStore:
    def __init__(self, work_dir: Path, shard_size: int, total: int) -> None:
        self.dir = Path(work_dir) / "shards"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.shard_size = shard_size
        self.total = total
        self.count = (total + shard_size - 1) // shard_size

    def path(self, index: int) -> Path:
        return self.dir / f"shard-{index:06d}.npz"

    def done(self) -> list[int]:
        return [i for i in range(self.count) if self.path(i).is_file()]

    def bounds(self, index: int) -> tuple[int, int]:
        return index * self.shard_size, min(self.total, (index + 1) * self.shard_size)

    def pending(self) -> tuple[int, int]:
        """(items, shards) not encoded yet: what a (resumed) build still has to write here."""
        done = self.done()
        return self.total - sum(hi - lo for lo, hi in map(self.bounds, done)), self.count - len(done)

    def write(self, index: int, shard: Shard) -> None:
        # Host and process in the name: on shared storage (``--engine ray``) writers on several machines
        # never share a temp file, even with equal process ids.
        tmp = self.dir / f".shard-{index:06d}.{socket.gethostname()}.{os.getpid()}.tmp"
        arrays: dict[str, np.ndarray] = {
            "ok": shard.ok,
            "embeds": shard.embeds,
            "tokens": shard.tokens,
            "kinds": np.asarray(shard.kinds, dtype=str),
            "details": np.asarray(shard.details, dtype=str),
        }
        if shard.scales is not None:
            arrays["scales"] = shard.scales
        if shard.visual is not None:
            arrays["visual"] = shard.visual
        try:
            with names_full_disk(self.path(index)), open(tmp, "wb") as fh:
                np.savez(fh, **arrays)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)  # a half-written shard would hold the space a re-run needs
            raise
        os.replace(tmp, self.path(index))

    def read(self, index: int) -> Shard:
        with np.load(self.path(index)) as z:
            return Shard(
                index=index,
                ok=z["ok"],
                embeds=z["embeds"],
                tokens=z["tokens"],
                scales=z["scales"] if "scales" in z.files else None,
                kinds=[str(k) for k in z["kinds"]],
                details=[str(d) for d in z["details"]],
                visual=z["visual"] if "visual" in z.files else None,
            )

    def read_ok_masks(self) -> list[np.ndarray]:
        masks = []
        for i in range(self.count):
            with np.load(self.path(i)) as z:
                masks.append(z["ok"])
        return masks


def encode_shard(
    index: int,
    results: Iterator[DecodeResult],
    n: int,
    encoder: Encoder,
    batch_size: int,
    rerank_dtype: str,
    on_items: Callable[[int], None],
) -> Shard:
    """Shard ``index`` of ``n`` items from their decode ``results`` (in order): the good ones encoded in
    batches of ``batch_size``, the bad ones marked with their reason; ``on_items(count)`` after each batch
    and each bad item. The one per-shard step of both engines (this module's ``encode_shards`` and
    ``indexer.ray_encoding``'s actors), so a shard's rows do not depend on where it was encoded."""
    ok = np.zeros(n, dtype=bool)
    kinds = [""] * n
    details = [""] * n
    embeds: list[np.ndarray] = []
    tokens: list[np.ndarray] = []
    visual: list[np.ndarray] = []
    batch: list[np.ndarray] = []

    def flush() -> None:
        if batch:
            out = encoder.encode_images(np.stack(batch))
            embeds.append(np.asarray(out.embeds, dtype=np.float32))
            tokens.append(np.asarray(out.tokens, dtype=np.float32))
            if out.visual is not None:
                visual.append(np.asarray(out.visual, dtype=np.float32))
            on_items(len(batch))
            batch.clear()

    for i in range(n):
        pixels, kind, detail = next(results)
        if pixels is None:
            kinds[i], details[i] = kind or "undecodable", detail or ""
            on_items(1)
            continue
        ok[i] = True
        batch.append(pixels)
        if len(batch) >= batch_size:
            flush()
    flush()
    if embeds:
        emb = np.concatenate(embeds)
        tok = np.concatenate(tokens)
    else:
        d = encoder.config.embed_dim
        emb = np.zeros((0, d), dtype=np.float32)
        tok = np.zeros((0, 0, 0), dtype=np.float32)
    scales = None
    if rerank_dtype == "int8" and tok.size:  # no tokens (a model without re-ranking, or no good item)
        tok_q, scales = quantize_tokens(tok)
    else:
        tok_q = tok.astype(np.float16)
    vis = np.concatenate(visual) if visual and len(visual) == len(embeds) else None
    return Shard(index, ok, emb, tok_q, scales, kinds, details, vis)


def encode_shards(
    items: Sequence[SourceItem],
    store: ShardStore,
    encoder: Encoder,
    pool: DecodePool,
    *,
    batch_size: int,
    rerank_dtype: str,
    progress: ProgressFn | None = None,
) -> int:
    """Encode every shard not on disk yet; returns how many were found done already (resumed)."""
    done = set(store.done())
    pending = [i for i in range(store.count) if i not in done]
    finished = sum(store.bounds(i)[1] - store.bounds(i)[0] for i in done)
    if progress:
        progress(finished, store.total)

    def start(i: int) -> Iterator[DecodeResult]:
        lo, hi = store.bounds(i)
        return iter(pool.map([str(it.path) for it in items[lo:hi]]))

    def on_items(count: int) -> None:
        nonlocal finished
        finished += count
        if progress:
            progress(finished, store.total)

    # Double buffering: the workers decode shard i+1 while this process encodes shard i.
    upcoming = start(pending[0]) if pending else None
    for pos, i in enumerate(pending):
        current = upcoming
        upcoming = start(pending[pos + 1]) if pos + 1 < len(pending) else None
        lo, hi = store.bounds(i)
        assert current is not None
        shard = encode_shard(i, current, hi - lo, encoder, batch_size, rerank_dtype, on_items)
        store.write(i, shard)
    return len(done)
