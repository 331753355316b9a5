"""Small index versions for the store's tests (and the indexer's rollback tests), written through the
store's own ``VersionWriter`` (sharded ones through ``ShardedVersionWriter``) with faiss and numpy directly,
not the builder: the tests pin the format and the engine; exact search is checked against a numpy brute
force and ANN against exact search."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np

from store.layout import FORMAT_VERSION, SHARDED_FORMAT_VERSION
from store.shards.sharded_writer import ShardedVersionWriter
from store.version.manifest import IndexManifest
from store.version.sharding import partition
from store.version.versions import GATE_KEY
from store.version.writer import StagedFiles, VersionWriter

D = 16
T, W = 5, 8
CATEGORIES = ("shoe", "bag", "hat", "scarf")


def vectors(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Clustered, like real embeddings (uniform random vectors make every ANN index look bad).
    centres = rng.normal(size=(20, D))
    x = centres[rng.integers(0, 20, n)] + 0.4 * rng.normal(size=(n, D))
    x = x.astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def write_version(
    root: Path,
    name: str,
    *,
    n: int = 300,
    factory: str = "Flat",
    search_params: dict | None = None,
    deleted: set[int] | frozenset[int] = frozenset(),
    int8: bool = False,
    seed: int = 0,
    fingerprint: str = "f" * 64,
    publish: bool = True,
    gate: bool | None = None,
) -> str:
    """One version written with faiss and numpy through ``VersionWriter``; ``gate`` records a quality-gate
    verdict in the manifest as the builder does (False: refused, and then normally not published)."""
    embeds = vectors(n, seed)
    with VersionWriter(root, name) as writer:
        index = faiss.index_factory(D, factory, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            index.train(embeds)
        index.add(embeds)
        writer.write_index(index)
        tokens = np.random.default_rng(seed + 1).normal(size=(n, T, W)).astype(np.float32)
        if int8:
            scales = np.abs(tokens).max(axis=2) / 127.0
            writer.save_arrays(embeds, np.round(tokens / scales[..., None]).astype(np.int8), scales)
        else:
            writer.save_arrays(embeds, tokens.astype(np.float16))
        writer.write_metadata(
            (i, f"sku-{i}", f"img/{i}.jpg", {"category": CATEGORIES[i % 4], "price": float(i)}, i in deleted)
            for i in range(n)
        )
        manifest = IndexManifest(
            format_version=FORMAT_VERSION,
            name=name,
            version=writer.version,
            created_at="2026-11-22T00:00:00Z",
            model_name="test-model",
            model_fingerprint=fingerprint,
            embed_dim=D,
            preprocessing={"image_size": 64, "mean": [0.5] * 3, "std": [0.25] * 3},
            count=n - len(deleted),
            index_factory=factory,
            search_params=search_params or {},
            measured_recall_at_10=None,
            language_recall_at_10={},
            build_seconds=0.0,
            skipped=[],
            checksums={},
            rerank={"dtype": "int8" if int8 else "fp16", "tokens": T, "width": W, "bytes_per_image": 0},
            parent_version=None,
            total_rows=n,
            build_params={} if gate is None else {GATE_KEY: {"passed": gate, "reasons": ["test verdict"]}},
        )
        return writer.finish(manifest, publish=publish).version


def brute_force(embeds: np.ndarray, q: np.ndarray, k: int, live: np.ndarray) -> np.ndarray:
    scores = q @ embeds.T
    scores[:, ~live] = -np.inf
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def grid_vectors(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """Random unit vectors rounded to multiples of 1/64: every inner product of two of them is exact in
    float32 whatever the summation order, so equal scores are real ties on every code path."""
    x = rng.normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return (np.round(x * 64) / 64).astype(np.float32)


def fields_of(item_id: str) -> dict:
    """Metadata of item ``prefix-<number>``; only every 7th item has ``sale`` (a field some shards lack)."""
    number = int(item_id.rsplit("-", 1)[1])
    return {"category": CATEGORIES[number % 4], "price": float(number)} | (
        {"sale": True} if number % 7 == 0 else {}
    )


def _manifest(
    name: str, version: str, d: int, count: int, total: int, factory: str, fmt: int
) -> IndexManifest:
    return IndexManifest(
        format_version=fmt,
        name=name,
        version=version,
        created_at="2026-11-24T00:00:00Z",
        model_name="test-model",
        model_fingerprint="f" * 64,
        embed_dim=d,
        preprocessing={"image_size": 64, "mean": [0.5] * 3, "std": [0.25] * 3},
        count=count,
        index_factory=factory,
        search_params={},
        measured_recall_at_10=None,
        language_recall_at_10={},
        build_seconds=0.0,
        skipped=[],
        checksums={},
        rerank={"dtype": "fp16", "tokens": T, "width": W, "bytes_per_image": 0},
        parent_version=None,
        total_rows=total,
    )


def _fill(
    files: StagedFiles,
    embeds: np.ndarray,
    ids: list[str],
    deleted: list[bool],
    factory: str,
    tokens: np.ndarray,
) -> None:
    index = faiss.index_factory(embeds.shape[1], factory if len(ids) else "Flat", faiss.METRIC_INNER_PRODUCT)
    if len(ids):
        if not index.is_trained:
            index.train(embeds)
        index.add(embeds)
    files.write_index(index)
    files.save_arrays(embeds, tokens.astype(np.float16))
    files.write_metadata(
        (row, i, f"img/{i}.jpg", fields_of(i), gone)
        for row, (i, gone) in enumerate(zip(ids, deleted, strict=True))
    )


def write_rows(
    root: Path,
    name: str,
    embeds: np.ndarray,
    ids: list[str],
    *,
    deleted: set[str] | frozenset[str] = frozenset(),
    shard_count: int | None = None,
    owners: np.ndarray | None = None,
    factory: str = "Flat",
    publish: bool = True,
) -> str:
    """One version of the given rows (ids ``prefix-<number>``; tokens derived from the embeddings):
    unsharded when ``shard_count`` is None, else sharded by the hash rule (or by ``owners``), each shard
    holding its items in the given order."""
    n, d = embeds.shape
    tokens = np.repeat(embeds[:, None, :W], T, axis=1) if d >= W else np.zeros((n, T, W), np.float32)
    gone = [i in deleted for i in ids]
    if shard_count is None:
        with VersionWriter(root, name) as writer:
            _fill(writer, embeds, ids, gone, factory, tokens)
            m = _manifest(name, writer.version, d, n - sum(gone), n, factory, FORMAT_VERSION)
            return writer.finish(m, publish=publish).version
    owners = partition(ids, shard_count) if owners is None else owners
    with ShardedVersionWriter(root, name, shard_count) as sharded:
        for s in range(shard_count):
            mine = np.flatnonzero(owners == s)
            stage = sharded.shard(s)
            _fill(stage, embeds[mine], [ids[j] for j in mine], [gone[j] for j in mine], factory, tokens[mine])
            live = sum(not gone[j] for j in mine)
            stage.seal(_manifest(name, sharded.version, d, live, len(mine), factory, FORMAT_VERSION))
        m = _manifest(name, sharded.version, d, n - sum(gone), n, factory, SHARDED_FORMAT_VERSION)
        m.sharding = sharded.sharding().to_dict()
        return sharded.finish(m, publish=publish).version


def sharded_order(ids: list[str], shard_count: int) -> np.ndarray:
    """The positions of ``ids`` in the global row order of a version sharded by the hash rule."""
    return np.argsort(partition(ids, shard_count), kind="stable")
