"""Small index versions for the store's tests (and the indexer's rollback tests), written through the
store's own ``VersionWriter`` with faiss and numpy directly, not the builder: the tests pin the format and
the engine; exact search is checked against a numpy brute force and ANN against exact search."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np

from store.layout import FORMAT_VERSION
from store.manifest import IndexManifest
from store.versions import GATE_KEY
from store.writer import VersionWriter

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
