"""Choosing, building and tuning the FAISS index.

Inner product on L2-normalised embeddings. Up to ``exact_max_items`` the index is exact (Flat). Above
it, HNSW32 over full vectors when it fits the memory budget (efConstruction 200: at 1M x 256 the default
40 needed 1.6-2.5x the search time for the same recall), else IVF with SQ8 or PQ codes, whose candidates
are re-scored exactly from ``embeddings.npy`` (IVF-PQ without re-scoring never reached 0.95 recall@10).
Search parameters are tuned on held-out queries to reach the target recall@10 against exact search.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import faiss
import numpy as np

from indexer import gpu
from store.version.reader import IndexVersion, SearchableIndex

log = logging.getLogger(__name__)

HNSW_M = 32
HNSW_EF_CONSTRUCTION = 200
EF_GRID = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
NPROBE_GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024)
ADD_CHUNK = 65_536


@dataclass
class IndexPlan:
    factory: str
    kind: str  # exact | hnsw | ivf | custom
    rescore_factor: int = 0
    estimated_bytes: int = 0
    build_params: dict[str, Any] = field(default_factory=dict)


def _hnsw_bytes(n: int, d: int) -> int:
    # Full vectors + level-0 links (2M ids) + upper levels (~1/M of nodes) + per-node bookkeeping.
    return int(n * (4 * d + 2 * HNSW_M * 4 * 1.05 + 24))


def _nlist(n: int) -> int:
    return int(min(65_536, max(16, 2 ** round(math.log2(4 * math.sqrt(n))))))


def choose_index(
    n: int, d: int, *, exact_max_items: int, memory_budget_mb: int, factory: str | None = None
) -> IndexPlan:
    """The index type for ``n`` vectors of dim ``d``; ``factory`` (a faiss factory string) overrides."""
    budget = memory_budget_mb * 1024 * 1024
    if factory:
        plan = IndexPlan(factory=factory, kind="custom")
        if "PQ" in factory or "SQ" in factory:
            plan.rescore_factor = 10 if "PQ" in factory else 2
        if factory.startswith("HNSW"):
            plan.build_params["efConstruction"] = HNSW_EF_CONSTRUCTION
        return plan
    if n <= exact_max_items:
        return IndexPlan("Flat", "exact", estimated_bytes=4 * n * d)
    if _hnsw_bytes(n, d) <= budget:
        return IndexPlan(
            f"HNSW{HNSW_M},Flat",
            "hnsw",
            estimated_bytes=_hnsw_bytes(n, d),
            build_params={"efConstruction": HNSW_EF_CONSTRUCTION},
        )
    nlist = _nlist(n)
    coarse = nlist * d * 4
    if n * (d + 8) + coarse <= budget:
        return IndexPlan(
            f"IVF{nlist},SQ8",
            "ivf",
            rescore_factor=2,
            estimated_bytes=n * (d + 8) + coarse,
            build_params={"nlist": nlist},
        )
    # PQ: the most bytes per vector that fit (m sub-quantizers of 8 bits, m dividing d).
    for m in sorted(
        {m for m in (d // 2, d // 4, d // 8, d // 16, 8, 4) if m >= 1 and d % m == 0}, reverse=True
    ):
        need = n * (m + 8) + coarse
        if need <= budget:
            return IndexPlan(
                f"IVF{nlist},PQ{m}x8",
                "ivf",
                rescore_factor=10,
                estimated_bytes=need,
                build_params={"nlist": nlist, "pq_m": m},
            )
    raise ValueError(
        f"{n} vectors of dim {d} do not fit a {memory_budget_mb} MB budget even as IVF-PQ; raise the budget"
    )


def _add_chunks(index: faiss.Index, embeds: np.ndarray) -> None:
    for start in range(0, embeds.shape[0], ADD_CHUNK):
        index.add(np.ascontiguousarray(embeds[start : start + ADD_CHUNK], dtype=np.float32))


def build_faiss_index(
    embeds: np.ndarray,
    plan: IndexPlan,
    *,
    use_gpu: bool | None = None,
    seed: int = 0,
    gpu_faiss: Any = None,
) -> tuple[faiss.Index, dict[str, Any]]:
    """Train and fill the planned index; returns it in CPU form and notes (training size, device).

    ``use_gpu`` None: as ``CCRK_INDEX_GPU=auto`` decides (``indexer.gpu``). ``gpu_faiss``: where the GPU
    entry points (``StandardGpuResources``, ``index_cpu_to_gpu``, ``index_gpu_to_cpu``) and the decision's
    probe come from, default faiss itself (tests pass a stand-in for a GPU). A GPU build that fails midway
    (a RuntimeError: out of memory, a PQ size the GPU kernels lack) is done again on the CPU, with the error
    in ``notes["gpu_fallback"]``."""
    d = embeds.shape[1]
    index = faiss.index_factory(d, plan.factory, faiss.METRIC_INNER_PRODUCT)
    notes: dict[str, Any] = {}
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efConstruction = int(plan.build_params.get("efConstruction", HNSW_EF_CONSTRUCTION))
        notes["efConstruction"] = index.hnsw.efConstruction
    gpu_module = faiss if gpu_faiss is None else gpu_faiss
    if use_gpu is None:
        decision = gpu.index_device("auto") if gpu_faiss is None else gpu.decide("auto", gpu_faiss)
        use_gpu = decision.use_gpu
    # faiss-gpu trains and adds flat and IVF indexes; HNSW graphs are built on the CPU.
    if use_gpu and not isinstance(index, faiss.IndexHNSW):
        try:
            res = gpu_module.StandardGpuResources()
            gpu_index = gpu_module.index_cpu_to_gpu(res, 0, index)
            _train(gpu_index, embeds, seed, notes)
            _add_chunks(gpu_index, embeds)
            notes["device"] = "gpu"
            return gpu_module.index_gpu_to_cpu(gpu_index), notes
        except RuntimeError as exc:  # e.g. out of memory, a PQ size the GPU kernels lack: the CPU builds it
            notes["gpu_fallback"] = gpu.first_line(exc)
            log.warning("GPU index build failed, building on the CPU: %s", gpu.explain(notes["gpu_fallback"]))
            notes.pop("train_size", None)
            gpu_index = res = None  # the GPU's memory goes before the CPU build
            index = faiss.index_factory(d, plan.factory, faiss.METRIC_INNER_PRODUCT)
    _train(index, embeds, seed, notes)
    _add_chunks(index, embeds)
    notes["device"] = "cpu"
    return index, notes


def _train(index: faiss.Index, embeds: np.ndarray, seed: int, notes: dict[str, Any]) -> None:
    if index.is_trained:
        return
    n = embeds.shape[0]
    ivf = faiss.try_extract_index_ivf(index) if not hasattr(index, "getDevice") else None
    nlist = ivf.nlist if ivf is not None else getattr(index, "nlist", 256)
    size = min(n, max(64 * nlist, 10_000))
    rows = np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False)) if size < n else None
    sample = np.ascontiguousarray(embeds[rows] if rows is not None else embeds[:], dtype=np.float32)
    index.train(sample)
    notes["train_size"] = int(size)


def recall_at(ann_rows: np.ndarray, exact_rows: np.ndarray, k: int) -> float:
    hits = [
        len(set(a[:k][a[:k] >= 0]) & set(e[:k][e[:k] >= 0])) / max(1, int((e[:k] >= 0).sum()))
        for a, e in zip(ann_rows, exact_rows, strict=True)
    ]
    return float(np.mean(hits)) if hits else 1.0


def _drop_self(rows: np.ndarray, self_rows: np.ndarray, k: int) -> np.ndarray:
    out = np.full((rows.shape[0], k), -1, dtype=np.int64)
    for i, (r, s) in enumerate(zip(rows, self_rows, strict=True)):
        kept = r[r != s][:k]
        out[i, : kept.size] = kept
    return out


def measure_recall(
    version: SearchableIndex,
    queries: np.ndarray,
    k: int = 10,
    self_rows: np.ndarray | None = None,
    exact_rows: np.ndarray | None = None,
) -> float:
    """recall@k of ``version.search`` against exact search; with ``self_rows`` (queries that are indexed
    items) each query's own row is left out of both lists."""
    extra = 1 if self_rows is not None else 0
    if exact_rows is None:
        _, exact_rows = version.search_exact(queries, k + extra)
        if self_rows is not None:
            exact_rows = _drop_self(exact_rows, self_rows, k)
    _, ann = version.search(queries, k + extra)
    if self_rows is not None:
        ann = _drop_self(ann, self_rows, k)
    return recall_at(ann, exact_rows, k)


def tune_search_params(
    version: IndexVersion,
    queries: np.ndarray,
    *,
    target: float,
    rescore_factor: int = 0,
    self_rows: np.ndarray | None = None,
    k: int = 10,
) -> tuple[dict[str, Any], float]:
    """The cheapest efSearch / nprobe whose recall@k on ``queries`` reaches ``target`` (else the best
    tried); returns (search params, measured recall)."""
    base: dict[str, Any] = {"rescore_factor": rescore_factor} if rescore_factor else {}
    extra = 1 if self_rows is not None else 0
    _, exact_rows = version.search_exact(queries, k + extra)
    if self_rows is not None:
        exact_rows = _drop_self(exact_rows, self_rows, k)
    if version.index_kind == "hnsw":
        grid = [{"efSearch": ef} for ef in EF_GRID]
    elif version.index_kind == "ivf":
        nlist = version.ivf_nlist
        grid = [{"nprobe": p} for p in NPROBE_GRID if p < nlist] + [{"nprobe": nlist}]
    else:
        version.set_search_params(base)
        return base, measure_recall(version, queries, k, self_rows, exact_rows)
    best: tuple[dict[str, Any], float] = ({}, -1.0)
    for params in grid:
        trial = {**params, **base}
        version.set_search_params(trial)
        recall = measure_recall(version, queries, k, self_rows, exact_rows)
        if recall > best[1]:
            best = (trial, recall)
        if recall >= target:
            return trial, recall
    version.set_search_params(best[0])
    return best


def extend_hnsw(
    index: faiss.Index,
    embeds: np.ndarray,
    first_new: int,
    *,
    ef_search: int,
    target: float,
    queries: int = 300,
    seed: int = 0,
) -> tuple[int, float]:
    """Add rows ``first_new:`` of ``embeds`` (all of a version's rows, memory-mapped) to an HNSW graph over
    the rows before them, then measure it: recall@10 against exact search on ``queries`` perturbed stored
    rows (half of them new), from ``ef_search`` up the tuning grid until ``target`` is reached. Returns
    (efSearch, recall): the first that reaches it, else the largest tried (the caller keeps the graph only
    when the target is reached; tuning then sets the version's efSearch as for any build)."""
    for lo in range(first_new, embeds.shape[0], ADD_CHUNK):
        index.add(np.ascontiguousarray(embeds[lo : lo + ADD_CHUNK], dtype=np.float32))
    rng = np.random.default_rng(seed)
    n = embeds.shape[0]
    half = queries // 2
    rows = np.concatenate(
        [rng.integers(first_new, n, size=min(half, n - first_new)), rng.integers(0, n, size=queries - half)]
    )
    q = np.asarray(embeds[np.sort(rows)], dtype=np.float32)
    q = q + rng.normal(0, 0.05, q.shape).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    exact = faiss.IndexFlatIP(embeds.shape[1])
    for lo in range(0, n, ADD_CHUNK):
        exact.add(np.ascontiguousarray(embeds[lo : lo + ADD_CHUNK], dtype=np.float32))
    _, want = exact.search(q, 10)
    ef, recall = ef_search, 0.0
    for ef in [e for e in EF_GRID if e >= ef_search] or [ef_search]:
        index.hnsw.efSearch = int(ef)
        _, got = index.search(q, 10)
        recall = recall_at(got, want, 10)
        if recall >= target:
            break
    return int(ef), recall
