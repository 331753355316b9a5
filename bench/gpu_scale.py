"""Index builds and bulk search at scale, on the CPU and (where faiss sees one) the GPU, in one run.

    python bench/gpu_scale.py                                   # 1M and 10M vectors, everything
    python bench/gpu_scale.py --sizes 100000 --queries 2000 --out bench/results/gpu-scale-cpu-100k-DATE.json
    python bench/gpu_scale.py --sizes 1000000,10000000 --budget-s 420 --no-encode

The same code runs on both devices: the CPU always, the GPU where ``indexer.gpu.decide("auto")`` says so (a
faiss GPU build that sees a GPU and passes the one-vector self-test). For each of ``--sizes`` synthetic
vectors (256-d, clustered like ``bench/index_throughput.py``'s: ``n // 250`` centres, intra-cluster
cosine ~0.5) and ``--queries`` queries drawn around the same centres:

- exact search (``faiss.knn_gpu`` on the GPU, else ``faiss.knn``, blocked BLAS, on the CPU) of the first
  ``--recall-queries`` queries: the reference answers, and exact search's own queries/s;
- for each method, its build time, then recall@10 against exact search while a search parameter is swept
  up its grid until recall reaches ``--target`` (0.95), then the queries/s of all ``--queries`` queries in
  one batch at that setting:
  - ``ivf``: ``IVF{nlist},Flat``, nlist = the indexer's (~4 sqrt(n), a power of two), trained and filled by
    the indexer's own ``build_faiss_index`` on the CPU and on the GPU (the GPU build ends in CPU form as
    the index format requires; it is copied back to the GPU to search there); nprobe swept;
  - ``hnsw``: HNSW32 (efConstruction 200, the indexer's), CPU only; efSearch swept;
  - ``cagra``: where faiss has ``GpuIndexCagra`` (faiss-gpu-cuvs): CAGRA built on the GPU (itopk_size
    swept), and the same graph served on the CPU as ``IndexHNSWCagra`` (efSearch swept);
- ``--encode``: photos encoded per second at batch 256 by the default model's ONNX image encoder on the
  CPU and, where ONNX Runtime has the CUDA provider, on the GPU (480x640 photos, preprocessing included).

``--budget-s`` bounds the run: a CPU build whose time, scaled from the previous size's (IVF ~n^1.5, HNSW
~n^1.1), would not fit what is left is skipped with that estimate, and nothing starts once the budget is
spent. Prints the JSON document, then a markdown table; ``--out`` writes the JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import faiss  # noqa: E402

from bench.index_throughput import clustered_vectors  # noqa: E402
from indexer.ann import EF_GRID, HNSW_EF_CONSTRUCTION, NPROBE_GRID, IndexPlan, _nlist, build_faiss_index  # noqa: E402
from indexer.ann import recall_at as _recall_at  # noqa: E402
from indexer.gpu import decide  # noqa: E402

K = 10
ITOPK_GRID = (32, 48, 64, 96, 128, 192, 256, 384, 512)
GROWTH = {"ivf": 1.5, "hnsw": 1.1}  # build time ~ n ** this, to estimate the next size's from the last's


class Run:
    """The time budget and what was measured so far (for the next size's estimates)."""

    def __init__(self, budget_s: float | None) -> None:
        self.start = time.perf_counter()
        self.budget_s = budget_s
        self.last_build: dict[tuple[str, str], tuple[int, float]] = {}  # (method, device) -> (n, build_s)

    def left(self) -> float:
        return float("inf") if self.budget_s is None else self.budget_s - (time.perf_counter() - self.start)

    def why_skip(self, method: str, device: str, n: int) -> str | None:
        if self.left() <= 0:
            return "time budget spent"
        prev = self.last_build.get((method, device))
        if prev is None or device != "cpu":
            return None
        estimate = prev[1] * (n / prev[0]) ** GROWTH.get(method, 1.0)
        if estimate > self.left():
            return (
                f"estimated {estimate:.0f} s from the {prev[0]}-vector build ({prev[1]:.1f} s),"
                f" {self.left():.0f} s left"
            )
        return None


def first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


def recall(ids: np.ndarray, exact: np.ndarray) -> float:
    return round(_recall_at(ids, exact, K), 4)


def sweep(
    name: str,
    grid: list[int],
    search: Callable[[np.ndarray, int], np.ndarray],
    queries: np.ndarray,
    exact: np.ndarray,
    target: float,
) -> tuple[list[dict[str, Any]], dict[str, Any], float]:
    """Recall@10 up ``grid`` until ``target``; returns the sweep, the setting chosen (the first that
    reaches it, else the best) and its recall."""
    rows: list[dict[str, Any]] = []
    best: tuple[dict[str, Any], float] = ({}, -1.0)
    for value in grid:
        got = recall(search(queries, value), exact)
        rows.append({name: value, "recall_at_10": got})
        if got > best[1]:
            best = ({name: value}, got)
        if got >= target:
            return rows, {name: value}, got
    return rows, best[0], best[1]


def throughput(search: Callable[[np.ndarray, int], np.ndarray], queries: np.ndarray, value: int) -> float:
    search(queries[: min(256, len(queries))], value)  # warm-up: kernels, caches
    t0 = time.perf_counter()
    search(queries, value)
    return round(len(queries) / (time.perf_counter() - t0), 1)


def measured(
    method: str,
    device: str,
    build_s: float,
    name: str,
    grid: list[int],
    search: Callable[[np.ndarray, int], np.ndarray],
    data: dict[str, np.ndarray],
    target: float,
    **extra: Any,
) -> dict[str, Any]:
    rows, setting, got = sweep(name, grid, search, data["recall_queries"], data["exact"], target)
    return {
        "method": method, "device": device, "build_s": round(build_s, 2), "sweep": rows, "setting": setting,
        "recall_at_10": got, "reached": got >= target,
        "throughput_qps": throughput(search, data["queries"], setting[name]) if setting else None,
        "throughput_queries": len(data["queries"]), **extra,
    }  # fmt: skip


def _set_param(index: Any, name: str, value: int, gpu: bool) -> None:
    space = faiss.GpuParameterSpace() if gpu else faiss.ParameterSpace()
    space.set_index_parameter(index, name, value)


def bench_ivf(device: str, xb: np.ndarray, data: dict[str, np.ndarray], target: float) -> dict[str, Any]:
    nlist = _nlist(len(xb))
    plan = IndexPlan(f"IVF{nlist},Flat", "ivf", build_params={"nlist": nlist})
    t0 = time.perf_counter()
    index, notes = build_faiss_index(xb, plan, use_gpu=device == "gpu")
    build_s = time.perf_counter() - t0
    extra: dict[str, Any] = {
        "nlist": nlist,
        "built_on": notes.get("device"),
        "train_size": notes.get("train_size"),
    }
    if notes.get("gpu_fallback"):
        extra["gpu_fallback"] = notes["gpu_fallback"]
    if device == "gpu":
        res = faiss.StandardGpuResources()
        t0 = time.perf_counter()
        index = faiss.index_cpu_to_gpu(res, 0, index)
        extra["to_gpu_s"] = round(time.perf_counter() - t0, 2)

    def search(q: np.ndarray, nprobe: int) -> np.ndarray:
        _set_param(index, "nprobe", nprobe, device == "gpu")
        return index.search(q, K)[1]

    grid = [p for p in NPROBE_GRID if p < nlist] + [nlist]
    return measured(plan.factory, device, build_s, "nprobe", grid, search, data, target, **extra)


def bench_hnsw(xb: np.ndarray, data: dict[str, np.ndarray], target: float) -> dict[str, Any]:
    plan = IndexPlan("HNSW32,Flat", "hnsw", build_params={"efConstruction": HNSW_EF_CONSTRUCTION})
    t0 = time.perf_counter()
    index, _ = build_faiss_index(xb, plan, use_gpu=False)
    build_s = time.perf_counter() - t0

    def search(q: np.ndarray, ef: int) -> np.ndarray:
        index.hnsw.efSearch = ef
        return index.search(q, K)[1]

    return measured(
        "HNSW32,Flat", "cpu", build_s, "efSearch", list(EF_GRID), search, data, target,
        efConstruction=HNSW_EF_CONSTRUCTION,
    )  # fmt: skip


def bench_cagra(xb: np.ndarray, data: dict[str, np.ndarray], target: float) -> list[dict[str, Any]]:
    """CAGRA built on the GPU and searched there, then the same graph searched on the CPU (IndexHNSWCagra)."""
    res = faiss.StandardGpuResources()
    config = faiss.GpuIndexCagraConfig()
    config.graph_degree, config.intermediate_graph_degree = 64, 128
    index = faiss.GpuIndexCagra(res, xb.shape[1], faiss.METRIC_INNER_PRODUCT, config)
    t0 = time.perf_counter()
    index.train(xb)  # CAGRA's train is its build: the graph over these vectors
    build_s = time.perf_counter() - t0

    def gpu_search(q: np.ndarray, itopk: int) -> np.ndarray:
        params = faiss.SearchParametersCagra()
        params.itopk_size = itopk
        return index.search(q, K, params=params)[1]

    rows = [
        measured(
            "CAGRA (graph_degree 64)",
            "gpu",
            build_s,
            "itopk_size",
            list(ITOPK_GRID),
            gpu_search,
            data,
            target,
        )
    ]
    try:
        t0 = time.perf_counter()
        cpu = faiss.index_gpu_to_cpu(index)  # IndexHNSWCagra: the graph, served on the CPU
        to_cpu_s = time.perf_counter() - t0

        def cpu_search(q: np.ndarray, ef: int) -> np.ndarray:
            cpu.hnsw.efSearch = ef
            return cpu.search(q, K)[1]

        rows.append(
            measured(
                "CAGRA graph as IndexHNSWCagra", "cpu", build_s + to_cpu_s, "efSearch", list(EF_GRID),
                cpu_search, data, target, to_cpu_s=round(to_cpu_s, 2), built_on="gpu",
            )
        )  # fmt: skip
    except RuntimeError as exc:  # the GPU figures stand without it
        rows.append({"method": "CAGRA graph as IndexHNSWCagra", "device": "cpu", "error": first_line(exc)})
    return rows


def exact_answers(xb: np.ndarray, queries: np.ndarray, gpu: bool) -> tuple[np.ndarray, dict[str, Any]]:
    t0 = time.perf_counter()
    if gpu:
        res = faiss.StandardGpuResources()
        _, ids = faiss.knn_gpu(res, queries, xb, K, metric=faiss.METRIC_INNER_PRODUCT)
    else:
        _, ids = faiss.knn(queries, xb, K, metric=faiss.METRIC_INNER_PRODUCT)
    seconds = time.perf_counter() - t0
    how = "faiss.knn_gpu" if gpu else "faiss.knn (CPU, blocked BLAS)"
    return ids, {"device": "gpu" if gpu else "cpu", "how": how, "queries": len(queries),
                 "seconds": round(seconds, 2), "qps": round(len(queries) / seconds, 1)}  # fmt: skip


def bench_size(
    n: int,
    args: argparse.Namespace,
    gpu: bool,
    has_cagra: bool,
    run: Run,
    out: dict[str, Any],
    checkpoint: Callable[[], None],
) -> None:
    """Fills ``out`` (already in the results, which ``checkpoint`` writes after each method)."""
    d = args.dim
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(max(64, n // 250), d)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    xb = clustered_vectors(n, d, 1, centres)
    queries = clustered_vectors(args.queries, d, 3, centres)
    out.update({"n": n, "dim": d, "centres": len(centres), "data_s": round(time.perf_counter() - t0, 1)})
    recall_q = queries[: args.recall_queries]
    exact, out["exact"] = exact_answers(xb, recall_q, gpu)
    data = {"queries": queries, "recall_queries": recall_q, "exact": exact}
    out["results"] = []
    jobs: list[tuple[str, str, Callable[[], Any]]] = []
    for method in args.methods:
        if method == "ivf":
            for device in (["gpu"] if gpu else []) + ["cpu"]:
                jobs.append(("ivf", device, lambda device=device: bench_ivf(device, xb, data, args.target)))
        elif method == "hnsw":
            jobs.append(("hnsw", "cpu", lambda: bench_hnsw(xb, data, args.target)))
        elif method == "cagra" and gpu and has_cagra:
            jobs.append(("cagra", "gpu", lambda: bench_cagra(xb, data, args.target)))
    for method, device, job in jobs:
        why = run.why_skip(method, device, n)
        if why is not None:
            out["results"].append({"method": method, "device": device, "skipped": why})
            continue
        try:
            got = job()
        except (RuntimeError, MemoryError) as exc:  # a GPU out of memory, an API a build lacks: noted
            out["results"].append(
                {"method": method, "device": device, "error": str(exc).splitlines()[0][:300]}
            )
            continue
        for row in got if isinstance(got, list) else [got]:
            out["results"].append(row)
        first = got[0] if isinstance(got, list) else got
        run.last_build[(method, device)] = (n, first["build_s"])
        checkpoint()
        print(
            json.dumps({"n": n, **{k: v for k, v in first.items() if k != "sweep"}}),
            file=sys.stderr,
            flush=True,
        )
    if not gpu:
        out["results"].append({"method": "ivf", "device": "gpu", "skipped": "no GPU (see machine.gpu)"})
    if gpu and not has_cagra and "cagra" in args.methods:
        out["results"].append({"method": "cagra", "device": "gpu", "skipped": "faiss has no GpuIndexCagra"})


def bench_encode(batch: int, batches: int) -> list[dict[str, Any]]:
    """Photos per second through the default model's ONNX image encoder, preprocessing included."""
    from PIL import Image

    from ccrk_settings import DEFAULT_MODEL_DIR
    from model.runtime.onnx_runtime import OnnxEncoder

    rng = np.random.default_rng(0)
    photos = [Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)) for _ in range(batch)]
    out = []
    import onnxruntime as ort

    devices = ["cpu"] + (["cuda"] if "CUDAExecutionProvider" in ort.get_available_providers() else [])
    for device in devices:
        encoder = OnnxEncoder(DEFAULT_MODEL_DIR, device=device, threads=os.cpu_count() or 1)
        encoder.encode_images(photos)  # warm-up at the timed shape (cuDNN picks its algorithms per shape)
        t0 = time.perf_counter()
        for _ in range(batches):
            encoder.encode_images(photos)
        seconds = time.perf_counter() - t0
        out.append({"device": encoder.device, "batch": batch, "batches": batches, "photo": "480x640",
                    "photos_per_s": round(batch * batches / seconds, 1)})  # fmt: skip
    return out


def table(results: dict[str, Any]) -> str:
    lines = [
        "| vectors | method | device | build s | setting | recall@10 | q/s (bulk) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for size in results["sizes"]:
        ex = size["exact"]
        lines.append(
            f"| {size['n']:,} | exact ({ex['how']}) | {ex['device']} | - | - | 1.0 | {ex['qps']:,} |"
        )
        for r in size["results"]:
            if "skipped" in r or "error" in r:
                lines.append(
                    f"| {size['n']:,} | {r['method']} | {r['device']} | {r.get('skipped') or r['error']}"
                    " | | | |"
                )
                continue
            setting = ", ".join(f"{k} {v}" for k, v in r["setting"].items())
            mark = "" if r["reached"] else " (target not reached)"
            lines.append(
                f"| {size['n']:,} | {r['method']} | {r['device']} | {r['build_s']} | {setting} | "
                f"{r['recall_at_10']}{mark} | {r['throughput_qps']:,} |"
            )
    for e in results.get("encode", []):
        lines.append(
            f"| photos | ONNX image encoder, batch {e['batch']} | {e['device']} | - | - | - |"
            f" {e['photos_per_s']:,} photos/s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--queries", type=int, default=10_000, help="Queries of the bulk throughput run.")
    parser.add_argument("--recall-queries", type=int, default=1000, help="Of them, measured for recall.")
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--methods", default="ivf,hnsw,cagra")
    parser.add_argument("--encode", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--encode-batches", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=None, help="Stop starting work after this long.")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    args.recall_queries = min(args.recall_queries, args.queries)

    run = Run(args.budget_s)
    decision = decide("auto")
    gpu, has_cagra = decision.use_gpu, hasattr(faiss, "GpuIndexCagra")
    results: dict[str, Any] = {
        "command": " ".join(["python", "bench/gpu_scale.py", *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "machine": {"cpus": os.cpu_count(), "faiss_threads": faiss.omp_get_max_threads(),
                    "platform": platform.platform(), "python": platform.python_version(),
                    "faiss": faiss.__version__, "gpu": decision.message, "cagra": has_cagra,
                    "loadavg_start": list(os.getloadavg())},
        "settings": {"queries": args.queries, "recall_queries": args.recall_queries, "target": args.target,
                     "k": K, "methods": args.methods, "budget_s": args.budget_s},
        "sizes": [],
    }  # fmt: skip

    def checkpoint() -> None:  # what is measured so far, should the run be stopped (a device's time limit)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")

    if args.encode:
        try:
            results["encode"] = bench_encode(256, args.encode_batches)
        except Exception as exc:  # a missing model or runtime: noted, the index part still runs
            results["encode_error"] = first_line(exc)
        checkpoint()
    for n in [int(s) for s in args.sizes.split(",") if s.strip()]:
        if run.left() <= 0:
            results["sizes_skipped"] = [*results.get("sizes_skipped", []), n]
            continue
        size: dict[str, Any] = {"n": n, "results": []}
        results["sizes"].append(size)
        bench_size(n, args, gpu, has_cagra, run, size, checkpoint)
    results["machine"]["loadavg_end"] = list(os.getloadavg())
    results["seconds"] = round(time.perf_counter() - run.start, 1)
    checkpoint()
    print(json.dumps(results, indent=2))
    print()
    print(table(results))


if __name__ == "__main__":
    main()
