"""Cluster scaling benchmark (issue 17): what serving and building on Ray cost on this box, and a model of N
machines computed from it. Not a test; prints a JSON document and tables, writes
``bench/results/cluster_scaling-<date>.json`` (``--out`` elsewhere; ``--quick`` writes to /tmp only).

    python bench/cluster_scaling.py                 # everything, default sizes (~4-6 min on 2 cores)
    python bench/cluster_scaling.py --quick         # tiny everything, part 3 left out: a < 60 s smoke

Measured (loopback only: every request goes to 127.0.0.1):
1. Per-hop costs, default Ray Serve against the fast path (``service.cluster.serving.FAST_PATH_ENV``:
   HAProxy as the HTTP proxy, gRPC between deployments). Ray Serve reads that environment at process start,
   so each mode (``--modes``) runs in a child process of this script that starts its own Ray
   (``ray.cluster_utils.Cluster`` on 127.0.0.1, ``--ray-nodes`` nodes, Serve's proxy on the head only) with
   the mode's environment. No-op deployments, each app deployed, measured and deleted alone: HTTP -> one
   deployment answering a precomputed top 10; HTTP -> a router deployment -> S no-op shard deployments at
   once (``--hop-shards``; one 128-d query each, a (1, 10) top-k back) -> merged
   (``store.shards.merge.merge_topk``).
   ``--requests`` sequential requests over one keep-alive httpx connection after ``--warmup``: p50/p95/p99.
   In fast mode the child also gets private HAProxy ports and files (another HAProxy on the box may hold the
   defaults) and a 1 s direct-ingress drain at teardown (else 30 s): neither touches a request. A mode that
   fails to start is recorded with its error and the run goes on.
2. Per-shard latency and CPU per query against the shard count: ``--items`` synthetic vectors placed as
   ``bench/search_load.py`` places them (around the demo model's image embeddings of ``--centres`` rendered
   catalogue products, cosine ~0.9 to their centre, 128-d, L2-normalised), written as a sharded version
   for each S of ``--shards`` through the store's writers (``ShardedVersionWriter``; no re-rank store: the
   writers allow none) with each shard's ANN index built by the indexer's own step
   (``indexer.sharded.write_shard_index``: ``choose_index`` within the shard's part of the memory budget).
   The indexer gives shards of up to 50k items an exact Flat index (CCRK_EXACT_MAX_ITEMS); this runs with
   ``--exact-max-items 0`` so every shard gets the HNSW32 index that shards of 10M-100M items get. Each
   shard's efSearch is tuned as the indexer tunes it (``tune_search_params``, target CCRK_TARGET_RECALL) on
   half of ``--queries`` real multilingual captions encoded by the demo model; the other half measures, in
   this process on one thread: one shard's search of 1 query, k=10 (p50/p99), the merged search
   (``ShardedIndex``, p50/p99), recall@10 of merged ANN against merged exact search, CPU time per query of
   each shard summed over the shards (``time.process_time``; ``time.thread_time`` beside it as a check),
   and bytes per item on disk.
3. Serving end to end (``--skip-serve`` to leave out): the real Serve app (``build_application``: the
   service's app as ingress, one deployment per shard) over a ``--serve-shards``-shard version of the
   build catalogue (demo model, ONNX), in the same two children: p50/p95/p99 of ``POST /v1/search``
   (re-ranking off, caches off, real captions) and the service's own stage timings.
4. Build throughput: ``indexer.build.build`` of ``--build-items`` synthetic catalogue products (64 px) with
   the local engine (this process, decode workers) and with ``--engine ray`` (a child process starting one
   local Ray node, outside the timing; a Ray Data actor pool), same box, same files: items/s of the
   encoding step (the build report's, the actor pool's start included), the steady rate (items done from a
   quarter to three quarters of the way, from the build's progress callback), end to end, their ratios
   (target >= 0.90 of local), and the largest difference between the two versions' embeddings.
5. A MODEL of N machines, computed from 1, 2 and the model's token shape, not measured: see ``model_rows``.

Over 400 lines because it is one self-contained script whose parts share their data (the versions of 2
feed the model of 5; the catalogue of 4 is served in 3) and whose Ray children are this same file, so that
one run is one file to read. It reuses ``bench/search_load.py``'s synthesis of vectors and queries.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from ccrk_settings import DEFAULT_MODEL_DIR, Settings  # noqa: E402
from service.cluster.serving import FAST_PATH_ENV  # noqa: E402
from store.shards.merge import merge_topk  # noqa: E402

DIM, K = 128, 10
MODES = ("default", "fast")
CHILD_TIMEOUT_S = 420
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # every Ray process on 127.0.0.1


def pct(values: list[float] | np.ndarray, scale: float = 1000.0) -> dict[str, float]:
    """p50/p95/p99/mean in ms of durations in seconds."""
    ms = np.asarray(values, dtype=np.float64) * scale
    if ms.size == 0:
        return {}
    out = {f"p{q}_ms": round(float(np.percentile(ms, q)), 3) for q in (50, 95, 99)}
    return out | {"mean_ms": round(float(ms.mean()), 3), "n": int(ms.size)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- 1 and 3: the Ray Serve children ----------------------------------------------------------------------


class NoopShard:
    """A shard deployment that does no work: the (1, k) answer of a search, precomputed."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.scores = np.sort(rng.random((1, K), dtype=np.float32))[:, ::-1].copy()
        self.rows = rng.integers(0, 100_000, (1, K)).astype(np.int64)

    async def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.scores[:, :k], self.rows[:, :k]


class NoopRouter:
    """The HTTP deployment: reads the JSON body; with no shards answers a precomputed top k, else sends a
    128-d query to every shard at once and merges their answers (``merge_topk``): the fan-out of the
    ingress's ``RemoteShardedIndex`` (which sends from a worker thread, then waits on each answer), here
    awaited on the replica's event loop."""

    def __init__(self, shards: list[Any]) -> None:
        self.shards = shards
        self.query = np.ones((1, DIM), np.float32) / math.sqrt(DIM)
        self.offsets = np.arange(len(shards), dtype=np.int64) * 100_000
        self.own = NoopShard(0)

    async def __call__(self, request: Any) -> dict[str, Any]:
        k = int((await request.json()).get("top_k", K))
        if not self.shards:
            scores, rows = self.own.scores[:, :k], self.own.rows[:, :k]
        else:
            answers = await asyncio.gather(*[s.search.remote(self.query, k) for s in self.shards])
            scores, rows = merge_topk([a[0] for a in answers], [a[1] for a in answers], self.offsets, k)
        return {"rows": rows[0].tolist(), "scores": [round(float(s), 6) for s in scores[0]]}


def start_ray(nodes: int, cpus: float, object_store_mb: int = 100) -> Any:
    """A Ray cluster of ``nodes`` nodes on 127.0.0.1 in this machine, this process attached as driver."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    ray_constants.ENABLE_RAY_CLUSTER = False  # the env says so too (set before this import)
    node = {"num_cpus": cpus, "node_ip_address": "127.0.0.1", "object_store_memory": object_store_mb << 20}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False,
                 logging_level=logging.WARNING)  # fmt: skip
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


def wait_ready(url: str, post: bool = False, seconds: float = 180.0) -> None:
    """Until ``url`` answers 200 (a GET, or with ``post`` a POST of a no-op body); bounded."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            answer = httpx.post(url, json={"top_k": K}, timeout=5) if post else httpx.get(url, timeout=5)
            if answer.status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{url} not answering within {seconds:.0f} s")


def sequential(url: str, bodies: list[bytes], requests: int, warmup: int) -> dict[str, Any]:
    """``requests`` POSTs one after another over one keep-alive connection, after ``warmup``: latency, and the
    service's stage timings when the answers carry them."""
    import httpx

    lat: list[float] = []
    stages: list[dict[str, float]] = []
    errors: list[str] = []
    headers = {"content-type": "application/json"}
    with httpx.Client(timeout=30, headers=headers) as client:
        for i in range(warmup):
            client.post(url, content=bodies[i % len(bodies)])
        for i in range(requests):
            body = bodies[(warmup + i) % len(bodies)]
            start = time.perf_counter()
            response = client.post(url, content=body)
            lat.append(time.perf_counter() - start)
            if response.status_code != 200:
                errors.append(f"{response.status_code} {response.text[:200]}")
            elif "timings_ms" in (data := response.json()):
                stages.append(data["timings_ms"])
    out: dict[str, Any] = pct(lat) | {"errors": len(errors), "first_errors": errors[:3]}
    if stages:
        out["server_ms_mean"] = {k: round(float(np.mean([s[k] for s in stages])), 3) for k in stages[0]}
    return out


def child_hops(spec: dict[str, Any], port: int) -> dict[str, Any]:
    """Each no-op app alone (``/hop0``: one deployment; ``/hopS``: router + S shards): deployed, measured,
    deleted, so that no other app's replicas run beside the one measured."""
    from ray import serve

    options = {"ray_actor_options": {"num_cpus": spec["replica_cpus"]}}
    shard = serve.deployment(NoopShard, **options)
    router = serve.deployment(NoopRouter, **options)
    body = [json.dumps({"query": "noop", "top_k": K}).encode()]
    out: dict[str, Any] = {}
    for s in [0, *spec["hop_shards"]]:
        started = time.perf_counter()
        shards = [shard.options(name=f"shard-{i}").bind(i + 1) for i in range(s)]
        serve.run(router.options(name="router").bind(shards), name=f"hop{s}", route_prefix=f"/hop{s}")
        url = f"http://127.0.0.1:{port}/hop{s}"
        wait_ready(url, post=True)
        label = "http_1_deployment" if s == 0 else f"http_router_{s}_shards"
        out[label] = {"shards": s, "deploy_s": round(time.perf_counter() - started, 2)}
        out[label] |= sequential(url, body, spec["requests"], spec["warmup"])
        serve.delete(f"hop{s}")
    return out


def child_serve_app(spec: dict[str, Any], port: int) -> dict[str, Any]:
    """The real app (ingress + one deployment per shard) over part 3's version: ``POST /v1/search``."""
    from ray import serve

    from service.cluster.deployments import ClusterOptions, build_application

    settings = Settings(**spec["settings"])
    started = time.perf_counter()
    app = build_application(settings, spec["serve_shards"], ClusterOptions.from_settings(settings))
    serve.run(app, name="ccrk", route_prefix="/")
    wait_ready(f"http://127.0.0.1:{port}/readyz")
    bodies = [json.dumps({"query": t, "top_k": K, "rerank": False}).encode() for t in spec["texts"]]
    result = sequential(f"http://127.0.0.1:{port}/v1/search", bodies, spec["requests"], spec["warmup"])
    return {"shards": spec["serve_shards"], "deploy_s": round(time.perf_counter() - started, 2)} | result


def child_serving(spec: dict[str, Any]) -> dict[str, Any]:
    """One mode: a fresh Ray with this process's environment, the hop apps, then the real app."""
    started = time.perf_counter()
    out: dict[str, Any] = {"mode": spec["mode"]}
    cluster = start_ray(spec["nodes"], spec["node_cpus"])
    out["ray_start_s"] = round(time.perf_counter() - started, 2)
    import ray
    from ray import serve

    try:
        port = free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        try:
            out["hops"] = child_hops(spec, port)
        except Exception as exc:
            out["hops_error"] = f"{type(exc).__name__}: {str(exc)[-2000:]}"
        if spec.get("serve"):
            try:
                out["serve"] = child_serve_app(spec, port)
            except Exception as exc:
                out["serve_error"] = f"{type(exc).__name__}: {str(exc)[-2000:]}"
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc)[-2000:]}"
    finally:
        teardown = time.perf_counter()
        try:
            with contextlib.suppress(Exception):
                serve.shutdown()
            out["serve_shutdown_s"] = round(time.perf_counter() - teardown, 2)
        finally:
            ray.shutdown()
            cluster.shutdown()
        out["teardown_s"] = round(time.perf_counter() - teardown, 2)
    return out


def child_build(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``--engine ray`` build: one local Ray node started here (outside the timing), then ``build``."""
    from indexer.build import build

    started = time.perf_counter()
    cluster = start_ray(1, spec["node_cpus"])
    ray_start_s = time.perf_counter() - started
    import ray

    try:
        return run_build(build, spec) | {"ray_start_s": round(ray_start_s, 2)}
    finally:
        ray.shutdown()
        cluster.shutdown()


def run_child(kind: str, spec: dict[str, Any], env_extra: dict[str, str], work: Path) -> dict[str, Any]:
    """This script as a child process (``--child``) with ``env_extra`` in its environment; its JSON answer,
    or the error it ended with. Its process group is killed if it outlives ``CHILD_TIMEOUT_S``."""
    work.mkdir(parents=True, exist_ok=True)
    spec_file, out_file, log_file = work / "spec.json", work / "out.json", work / "child.log"
    spec_file.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCRK_", "RAY_ADDRESS", "RAY_SERVE_"))}
    env |= LOOPBACK_ENV | {"PYTHONPATH": str(REPO)} | env_extra
    command = [sys.executable, __file__, "--child", kind, "--child-spec", str(spec_file)]
    command += ["--child-out", str(out_file)]
    with open(log_file, "w") as log:
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        finally:  # overtime, or this process interrupted: the child's group (its Ray too) goes
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    if out_file.is_file():
        return json.loads(out_file.read_text())
    tail = log_file.read_text()[-1500:]
    return {"error": f"child {kind} exited {proc.returncode} without an answer; log tail: {tail}"}


def kill_strays(marker: str) -> list[int]:
    """Processes whose command line names ``marker`` (this run's private HAProxy folder): left behind by a
    child that died, they are this run's; ended by pid."""
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                os.kill(int(entry.name), signal.SIGTERM)
                killed.append(int(entry.name))
    return killed


def fast_env(hap_dir: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The fast path's environment, and what keeps this run's HAProxy apart from any other on the box."""
    hap_dir.mkdir(parents=True, exist_ok=True)
    isolation = {
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(hap_dir / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(hap_dir / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(hap_dir),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(hap_dir / "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(hap_dir / "metrics.sock"),
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",  # teardown only
    }
    return dict(FAST_PATH_ENV), isolation


# -- 2: sharded versions in process -----------------------------------------------------------------------


def synth_vectors(n: int, centres: np.ndarray, seed: int = 0) -> np.ndarray:
    """As ``search_load.build_index``: unit vectors, cosine ~0.9 to a real image embedding."""
    from search_load import ITEM_SPREAD

    rng = np.random.default_rng(seed)
    out = np.empty((n, DIM), np.float32)
    for start in range(0, n, 100_000):
        m = min(100_000, n - start)
        x = centres[rng.integers(0, len(centres), m)]
        x = x + rng.normal(0, ITEM_SPREAD / np.sqrt(DIM), (m, DIM)).astype(np.float32)
        out[start : start + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def write_sharded(
    root: Path, name: str, vectors: np.ndarray, shard_count: int, settings: Settings, tune_q: np.ndarray
) -> dict[str, Any]:
    """A published sharded version of ``vectors`` (ids item-NNNNNNN, owned by the store's hash rule), each
    shard's index as the indexer builds and tunes it; no re-rank store."""
    import dataclasses

    import faiss

    from indexer.ann import tune_search_params
    from indexer.pipeline import rerank_info, utc_now
    from indexer.sharded import factories, write_shard_index
    from store.layout import FORMAT_VERSION, SHARDED_FORMAT_VERSION
    from store.shards.sharded_writer import ShardedVersionWriter
    from store.version.manifest import IndexManifest, model_fingerprint, model_name_of
    from store.version.reader import IndexVersion
    from store.version.sharding import SHARD_KEY, partition

    n = len(vectors)
    ids = [f"item-{i:07d}" for i in range(n)]
    owners = partition(ids, shard_count)
    categories = ("mug", "hat", "bag", "shoe", "lamp", "car", "umbrella", "t_shirt")
    started = time.perf_counter()
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    template = IndexManifest(
        format_version=FORMAT_VERSION, name=name, version="", created_at="", embed_dim=DIM, preprocessing={},
        model_name=model_name_of(DEFAULT_MODEL_DIR), model_fingerprint=model_fingerprint(DEFAULT_MODEL_DIR),
        count=0, index_factory="", search_params={}, measured_recall_at_10=None, language_recall_at_10={},
        build_seconds=0.0, skipped=[], checksums={}, rerank=rerank_info("fp16", 0, 0), parent_version=None,
    )  # fmt: skip
    shards = []
    with ShardedVersionWriter(root, name, shard_count) as writer:
        for i in range(shard_count):
            mine = np.flatnonzero(owners == i)
            stage = writer.shard(i)
            with stage.arrays(len(mine), DIM) as arrays:
                arrays.append(vectors[mine])
            stage.write_metadata(
                (r, ids[j], None, {"category": categories[j % 8], "price": float(j % 500)}, False)
                for r, j in enumerate(mine)
            )
            t0 = time.perf_counter()
            plan, notes = write_shard_index(stage, len(mine), DIM, settings, None, shard_count)
            index_s = time.perf_counter() - t0
            manifest = dataclasses.replace(
                template, version=writer.version, created_at=utc_now(), count=len(mine), total_rows=len(mine),
                index_factory=plan.factory,
                build_params={**plan.build_params, **notes, SHARD_KEY: {"index": i, "of": shard_count}},
            )  # fmt: skip
            with IndexVersion(stage.stage, manifest) as shard:
                params, recall = tune_search_params(shard, tune_q, target=settings.target_recall)
            manifest.search_params = params
            manifest.measured_recall_at_10, manifest.recall_measured_on = round(recall, 4), len(tune_q)
            stage.seal(manifest)
            shards.append({"items": len(mine), "index": plan.factory, "index_build_s": round(index_s, 2),
                           "search_params": params, "tuned_recall_at_10": round(recall, 4)})  # fmt: skip
        sharding = writer.sharding()
        version = dataclasses.replace(
            template, format_version=SHARDED_FORMAT_VERSION, version=writer.version, created_at=utc_now(),
            count=n, total_rows=n, index_factory=factories(sharding), sharding=sharding.to_dict(),
            build_seconds=round(time.perf_counter() - started, 2),
        )  # fmt: skip
        writer.finish(version)
    return {"write_s": round(time.perf_counter() - started, 2), "per_shard": shards}


def disk_bytes(folder: Path) -> dict[str, int]:
    """Bytes on disk per kind of file (summed over the shards), manifests included."""
    out: dict[str, int] = {}
    for path in folder.rglob("*"):
        if path.is_file():
            kind = path.name.split(".")[0] if path.suffix != ".json" else "manifests"
            out[kind] = out.get(kind, 0) + path.stat().st_size
    return out


def measure_shards(root: Path, name: str, test_q: np.ndarray, repeat: int) -> tuple[dict[str, Any], list]:
    """One shard's search of 1 query (each shard), the merged search, CPU per query, recall@10; returns the
    summary and the raw per-shard latencies (seconds) of each shard."""
    import faiss

    from indexer.ann import recall_at
    from store.opening import open_version

    faiss.omp_set_num_threads(1)
    queries = [test_q[i : i + 1] for i in range(len(test_q))] * repeat
    gc.collect()
    time.sleep(0.2)  # the build's faiss threads stop spinning (their CPU would count in process_time)
    gc.disable()  # no collection inside a timed loop
    with contextlib.ExitStack() as stack, open_version(root, name) as index:
        stack.callback(gc.enable)
        per_shard_lat: list[list[float]] = []
        cpu_ms, thread_ms = [], []
        for shard in index.shards:
            for q in queries[:20]:
                shard.search(q, K)  # warm-up
            lat = []
            cpu, own = time.process_time(), time.thread_time()
            for q in queries:
                t = time.perf_counter()
                shard.search(q, K)
                lat.append(time.perf_counter() - t)
            cpu_ms.append((time.process_time() - cpu) * 1000 / len(queries))
            thread_ms.append((time.thread_time() - own) * 1000 / len(queries))
            per_shard_lat.append(lat)
        merged = []
        cpu = time.process_time()
        for q in queries:
            t = time.perf_counter()
            index.search(q, K)
            merged.append(time.perf_counter() - t)
        merged_cpu = (time.process_time() - cpu) * 1000 / len(queries)
        recall = recall_at(index.search(test_q, K)[1], index.search_exact(test_q, K)[1], K)
        pooled = [x for lat in per_shard_lat for x in lat]
        slowest_p99 = max(float(np.percentile(lat, 99)) * 1000 for lat in per_shard_lat)
        summary = {
            "per_shard_search_ms": pct(pooled), "slowest_shard_p99_ms": round(slowest_p99, 3),
            "merged_search_ms": pct(merged), "cpu_ms_per_query_per_shard": [round(c, 4) for c in cpu_ms],
            "cpu_ms_per_query_sum_over_shards": round(sum(cpu_ms), 4),
            "cpu_ms_per_query_merged": round(merged_cpu, 4),
            "thread_cpu_ms_per_query_sum_over_shards": round(sum(thread_ms), 4),
            "merged_recall_at_10_vs_exact": round(recall, 4), "test_queries": len(test_q),
            "timed_searches_per_shard": len(queries),
        }  # fmt: skip
    return summary, per_shard_lat


def synth_inputs(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, tuple[int, int], float]:
    """The demo model's image embeddings of rendered products (centres), its encodings of real captions
    (queries), the (T, W) shape of its re-rank tokens (``indexer.disk.token_shape``), and the seconds taken.
    The encoder is gone afterwards: its idle threads would count in the CPU times measured next."""
    from search_load import centre_embeddings, queries, query_embeddings

    from indexer.disk import token_shape
    from model.runtime import load_encoder

    started = time.perf_counter()
    encoder = load_encoder(DEFAULT_MODEL_DIR, backend="onnx", threads=os.cpu_count() or 1)
    args.image_size = encoder.config.vision.image_size
    shape = token_shape(encoder, args.image_size)
    centres = centre_embeddings(encoder, args.centres)
    q = query_embeddings(encoder, queries(args.queries)).astype(np.float32)
    del encoder
    return centres, q, shape, time.perf_counter() - started


def bench_shards(
    args: argparse.Namespace, tmp: Path, centres: np.ndarray, q: np.ndarray, synth_s: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    from store.layout import index_dir
    from store.version.versions import current_version

    started = time.perf_counter() - synth_s
    tune_q, test_q = q[: len(q) // 2], q[len(q) // 2 :]
    vectors = synth_vectors(args.items, centres)
    settings = Settings(exact_max_items=args.exact_max_items, memory_budget_mb=args.memory_budget_mb)
    result: dict[str, Any] = {
        "items": args.items, "dim": DIM, "centres": args.centres, "tuning_queries": len(tune_q),
        "test_queries": len(test_q), "exact_max_items": args.exact_max_items,
        "memory_budget_mb": args.memory_budget_mb, "target_recall": settings.target_recall,
        "synthesis_s": round(time.perf_counter() - started, 2), "by_shards": [],
    }  # fmt: skip
    raw: dict[str, Any] = {}
    for s in args.shards:
        name = f"scale-s{s}"
        written = write_sharded(tmp / "versions", name, vectors, s, settings, tune_q)
        summary, lat = measure_shards(tmp / "versions", name, test_q, args.search_repeat)
        folder = index_dir(tmp / "versions", name) / str(current_version(tmp / "versions", name))
        files = disk_bytes(folder)
        row = {"shards": s, "items_per_shard": round(args.items / s), **written, **summary}
        row["disk_bytes_per_item"] = {k: round(v / args.items, 1) for k, v in sorted(files.items())}
        row["disk_bytes_per_item"]["total"] = round(sum(files.values()) / args.items, 1)
        result["by_shards"].append(row)
        raw[str(s)] = {"latencies": lat, "items_per_shard": args.items / s, "cpu_ms": summary}
        shutil.rmtree(tmp / "versions" / name, ignore_errors=True)
        print(json.dumps({k: v for k, v in row.items() if k != "per_shard"}), file=sys.stderr, flush=True)
    points = [(r["items_per_shard"], r["per_shard_search_ms"]["p50_ms"]) for r in result["by_shards"]]
    if len({n for n, _ in points}) >= 2:
        b, a = np.polyfit(np.log([n for n, _ in points]), [p for _, p in points], 1)
        result["fit_p50_ms_vs_ln_items_per_shard"] = {"a": round(float(a), 4), "b": round(float(b), 4)}
    return result, raw


# -- 4 (and 3's version): builds -------------------------------------------------------------------------


def run_build(build: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """One ``build`` of the catalogue with ``spec["settings"]``: the report's figures and the steady rate."""
    marks: list[tuple[float, int]] = []
    started = time.perf_counter()
    settings = Settings(**spec["settings"])
    mark = lambda done, total: marks.append((time.perf_counter(), done))  # noqa: E731
    report = build(spec["name"], [Path(spec["source"])], settings=settings, progress=mark)
    total_s = time.perf_counter() - started
    # Steady rate: items done between a quarter and three quarters of the way (no start, no tail).
    total = max(1, report.items_total)
    q1 = next(((t, d) for t, d in marks if d >= total / 4), None)
    q3 = next(((t, d) for t, d in marks if d >= 3 * total / 4), None)
    steady = (q3[1] - q1[1]) / (q3[0] - q1[0]) if q1 and q3 and q3[0] > q1[0] else None
    return {
        "engine": report.engine, "items": report.items_total, "count": report.count, "shards": report.shards,
        "encode_s": round(report.encode_seconds, 3), "encode_items_per_s": round(report.items_per_second, 1),
        "steady_items_per_s": round(steady, 1) if steady else None, "end_to_end_s": round(total_s, 2),
        "end_to_end_items_per_s": round(report.items_total / total_s, 1),
        "encode_nodes": len(report.encode_nodes), "published": report.published,
    }  # fmt: skip


def compare_versions(root_a: Path, root_b: Path, name: str) -> dict[str, Any]:
    from store.version.reader import IndexVersion

    with IndexVersion.open(root_a, name) as a, IndexVersion.open(root_b, name) as b:
        rows = range(a.manifest.count)
        same_ids = [it["id"] for it in a.items(rows)] == [it["id"] for it in b.items(rows)]
        ea, eb = np.load(a.path / "embeddings.npy"), np.load(b.path / "embeddings.npy")
        ta, tb = np.load(a.path / "rerank_tokens.npy"), np.load(b.path / "rerank_tokens.npy")
        diff = float(np.abs(ea - eb).max()) if ea.shape == eb.shape else float("inf")
        tok = np.abs(ta.astype(np.float32) - tb.astype(np.float32)).max() if ta.shape == tb.shape else np.inf
        return {
            "same_ids_in_same_rows": same_ids, "embeddings_max_abs_diff": diff,
            "embeddings_within_1e-6": diff <= 1e-6, "rerank_tokens_max_abs_diff": float(tok),
        }  # fmt: skip


def build_settings(root: Path, args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    return {
        "model_dir": str(DEFAULT_MODEL_DIR), "backend": "onnx", "device": "cpu", "index_root": str(root),
        "shard_size": args.build_shard_size, "keep_versions": 1, "threads": args.build_threads,
        "index_workers": args.build_workers, **extra,
    }  # fmt: skip


def bench_builds(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from indexer.build import build
    from synthetic.synth import SynthConfig, generate_catalogue

    cat = tmp / "catalogue"
    started = time.perf_counter()
    generate_catalogue(cat, SynthConfig(seed=0, n_train=0, n_val=0, n_test=args.build_items, image_size=64))
    out: dict[str, Any] = {"items": args.build_items, "image_size": 64, "shard_size": args.build_shard_size}
    out["catalogue_s"] = round(time.perf_counter() - started, 2)
    source = str(cat / "test.jsonl")
    if args.skip_build:
        return out | {"skipped": "--skip-build", "source": source}
    local = {"name": "cat", "source": source, "settings": build_settings(tmp / "local", args)}
    out["local"] = run_build(build, local)
    out["local"]["config"] = f"{args.build_workers} decode workers, encoder {args.build_threads} threads"
    ray_settings = build_settings(
        tmp / "ray", args, engine="ray", ray_actors=args.ray_actors, threads=args.ray_actor_threads,
        ray_cpus_per_actor=args.ray_cpus_per_actor, index_workers=0,
    )  # fmt: skip
    spec = {"name": "cat", "source": source, "settings": ray_settings, "node_cpus": args.ray_node_cpus}
    out["ray"] = run_child("build", spec, {}, tmp / "child-build")
    if "error" not in out["ray"]:
        out["ray"]["config"] = (
            f"1 Ray node of {args.ray_node_cpus:g} CPUs, {args.ray_actors} actors x "
            f"{args.ray_cpus_per_actor:g} CPU, encoder {args.ray_actor_threads} threads each"
        )
        for key in ("encode_items_per_s", "steady_items_per_s", "end_to_end_items_per_s"):
            if out["local"].get(key) and out["ray"].get(key):
                out[f"ratio_{key}"] = round(out["ray"][key] / out["local"][key], 3)
        out["target_ratio"] = 0.90
        out["equality"] = compare_versions(tmp / "local", tmp / "ray", "cat")
    out["source"] = source
    return out


# -- 5: the model ----------------------------------------------------------------------------------------


def hop_line(hops: dict[str, Any]) -> tuple[float, float, float, float, str]:
    """(a50, b50, a99, b99, how): the fan-out hop as a + b*S ms, p50 and p99 (least squares over S)."""
    points = [(v["shards"], v["p50_ms"], v["p99_ms"]) for v in hops.values() if v["shards"]]
    if not points:
        raise ValueError("no fan-out measurement")
    s = np.array([p[0] for p in points], np.float64)
    if len(points) == 1:
        return points[0][1], 0.0, points[0][2], 0.0, f"flat at S={int(s[0])} (one point)"
    b50, a50 = np.polyfit(s, [p[1] for p in points], 1)
    b99, a99 = np.polyfit(s, [p[2] for p in points], 1)
    return float(a50), float(b50), float(a99), float(b99), f"linear fit over S={s.astype(int).tolist()}"


def model_rows(args: argparse.Namespace, shards: dict[str, Any], raw: dict[str, Any], hops: dict[str, Any],
               token_shape: tuple[int, int]) -> dict[str, Any]:  # fmt: skip
    """The N-machine model (computed, not measured): see ``assumptions`` in the result."""
    base_s = str(min(args.shards))
    base = raw[base_s]
    n0 = float(base["items_per_shard"])
    samples = np.concatenate([np.asarray(lat) for lat in base["latencies"]]) * 1000
    row0 = next(r for r in shards["by_shards"] if str(r["shards"]) == base_s)
    per_item = row0["disk_bytes_per_item"]
    searchable = per_item["total"]
    tokens, width = token_shape
    rerank = tokens * width * 2
    mode = next((m for m in ("fast", "default") if hops.get(m, {}).get("hops")), None)
    if mode is None:
        return {"label": "model", "skipped": "no hop measurement to build it on"}
    a50, b50, a99, b99, how = hop_line(hops[mode]["hops"])
    cpu1 = float(np.mean(base["cpu_ms"]["cpu_ms_per_query_per_shard"]))
    usable = args.node_memory_gib * (1 << 30) * args.usable_fraction
    rng = np.random.default_rng(0)
    rows = []
    for total in args.model_items:
        need = total * (searchable + rerank)
        shard_count = max(1, math.ceil(need / usable))
        per_shard = total / shard_count
        factor = math.log(per_shard) / math.log(n0)
        draws = rng.choice(samples, size=(args.model_draws, shard_count)).max(axis=1) * factor
        slow50, slow99 = float(np.percentile(draws, 50)), float(np.percentile(draws, 99))
        per_replica_qps = 1000.0 / (cpu1 * factor)
        hop50, hop99 = a50 + b50 * shard_count, a99 + b99 * shard_count
        rows.append({
            "items": total, "bytes_per_item": round(searchable + rerank, 1),
            "total_gib": round(need / 2**30, 1), "shards": shard_count, "replicas": args.replicas,
            "nodes": shard_count * args.replicas,
            "items_per_shard": round(per_shard), "shard_latency_scale": round(factor, 3),
            "hop_p50_ms": round(hop50, 3), "slowest_shard_p50_ms": round(slow50, 3),
            "slowest_shard_p99_ms": round(slow99, 3), "latency_p50_ms": round(hop50 + slow50, 3),
            "latency_p99_ms": round(hop99 + slow99, 3), "per_replica_qps": round(per_replica_qps, 1),
            "qps": round(per_replica_qps * args.replicas, 1),
            "shards_if_rerank_store_on_disk": max(1, math.ceil(total * searchable / usable)),
        })  # fmt: skip
    return {
        "label": "model (computed from the measurements above, not measured)",
        "hop_mode": mode,
        "inputs": {
            "measured_items_per_shard": n0, "searchable_bytes_per_item": searchable,
            "searchable_bytes_per_item_by_file": per_item, "rerank_bytes_per_item": rerank,
            "rerank_token_shape": [tokens, width],
            "rerank_token_shape_from": "indexer.disk.token_shape: the demo model's ONNX image encoder on one "
            f"blank {args.image_size}px image (config.json: swin patch 4, depths [2, 2], embed_dim 64 -> "
            f"{tokens} tokens x {width}); stored fp16: {tokens} x {width} x 2 bytes",
            "node_memory_gib": args.node_memory_gib, "usable_fraction": args.usable_fraction,
            "hop_ms_a_b": {"p50": [round(a50, 3), round(b50, 3)], "p99": [round(a99, 3), round(b99, 3)],
                           "fit": how},
            "cpu_ms_per_query_one_shard": round(cpu1, 4),
        },
        "assumptions": [
            "every file of a shard is resident in memory (ANN index, embeddings, metadata and the fp16 "
            "re-rank store); shards = ceil(total bytes / usable bytes of one node); one replica per node, so "
            "nodes = shards x replicas",
            f"hop cost = the {mode} mode's HTTP -> router -> S shards -> merge p50 (p99) with no-op shards, "
            "extrapolated linearly in S (a + b*S); here every replica shares this box's cores, so b is "
            "rather an upper bound for shards on machines of their own",
            "slowest shard = the max of S draws from the measured one-shard search latencies "
            f"({n0:,.0f} items), scaled by ln(items per shard) / ln({n0:,.0f}): HNSW's search cost grows "
            "~log n at a fixed efSearch. A lower bound: larger graphs miss the CPU caches more often",
            "p99 = hop p99 + p99 of the slowest of S (adding p99s: an upper bound of their sum's p99)",
            "throughput = replicas x one replica's queries/s on one core (1000 / CPU ms per query of one "
            "shard, scaled as the latency; Ray Serve's own CPU per call at the replica not counted, so an "
            "upper bound); every query visits one replica of every shard",
            "excluded: query encoding and re-ranking at the ingress (part 3, bench/search_load.py), the "
            "network between machines (loopback here), ingress replicas (they scale apart)",
        ],
        "rows": rows,
    }  # fmt: skip


# -- report ----------------------------------------------------------------------------------------------


def print_tables(report: dict[str, Any]) -> None:
    try:
        import rich.box
        import rich.console
        import rich.table
    except ImportError:  # plain text
        rich = None

    def show(title: str, head: list[str], rows: list[list[Any]]) -> None:
        if rich is None:
            print(f"\n{title}\n" + " | ".join(head))
            for r in rows:
                print(" | ".join(str(c) for c in r))
            return
        table = rich.table.Table(title=title, box=rich.box.MARKDOWN, title_justify="left")
        for h in head:
            table.add_column(h)
        for r in rows:
            table.add_row(*[str(c) for c in r])
        rich.console.Console(width=200).print(table)

    rows = []
    for mode in report["parameters"]["modes"]:
        part = report["serving"].get(mode, {})
        for label, v in part.get("hops", {}).items():
            rows.append([mode, label, v["p50_ms"], v["p95_ms"], v["p99_ms"], v["n"], v["errors"]])
        if "serve" in part:
            v = part["serve"]
            st = v.get("server_ms_mean", {})
            stages = "/".join(str(st.get(k)) for k in ("encode", "search", "total"))
            path = f"/v1/search, {v['shards']} shards (server encode/search/total {stages} ms)"
            rows.append([mode, path, v["p50_ms"], v["p95_ms"], v["p99_ms"], v["n"], v["errors"]])
        for key in ("error", "hops_error", "serve_error"):
            if key in part:
                last = part[key].strip().splitlines()[-1][:200]  # the error, after the traceback
                rows.append([mode, f"{key}: {last}", "-", "-", "-", "-", "-"])
    show("1+3. Per-hop costs and serving end to end (ms, sequential, keep-alive, loopback)",
         ["mode", "path", "p50", "p95", "p99", "requests", "errors"], rows)  # fmt: skip
    sh = report.get("shards", {})
    rows = [
        [r["shards"], f"{r['items_per_shard']:,}", r["per_shard"][0]["index"],
         "/".join(str(p["search_params"].get("efSearch", "-")) for p in r["per_shard"]),
         f"{r['per_shard_search_ms']['p50_ms']} / {r['per_shard_search_ms']['p99_ms']}",
         f"{r['merged_search_ms']['p50_ms']} / {r['merged_search_ms']['p99_ms']}",
         r["merged_recall_at_10_vs_exact"],
         f"{r['cpu_ms_per_query_sum_over_shards']} / {r['thread_cpu_ms_per_query_sum_over_shards']}",
         r["disk_bytes_per_item"]["total"], r["write_s"]]
        for r in sh.get("by_shards", [])
    ]  # fmt: skip
    show(f"2. Shards of {sh.get('items', 0):,} items, in process, one thread",
         ["S", "items/shard", "index", "efSearch", "one shard p50/p99 ms", "merged p50/p99 ms", "recall@10",
          "CPU ms/query, sum of shards: process / thread", "disk B/item", "write s"], rows)  # fmt: skip
    b = report.get("builds", {})
    keys = ("encode_items_per_s", "steady_items_per_s", "end_to_end_items_per_s")
    rows = [[e, *(b[e].get(k) for k in keys), b[e].get("config", b[e].get("error", "")[-200:])]
            for e in ("local", "ray") if e in b]  # fmt: skip
    if "equality" in b:
        eq = b["equality"]
        note = f"target >= 0.90; embeddings max |diff| {eq['embeddings_max_abs_diff']:.2e}"
        note += f", same ids {eq['same_ids_in_same_rows']}"
        rows.append(["ray / local", *(b.get(f"ratio_{k}") for k in keys), note])
    show(f"4. Build throughput, {b.get('items', 0)} catalogue items (items/s)",
         ["engine", "encode", "steady", "end to end", "config"], rows)  # fmt: skip
    model, par = report.get("model", {}), report["parameters"]
    rows = [[f"{r['items']:,}", r["bytes_per_item"], r["total_gib"], r["shards"], r["nodes"], r["hop_p50_ms"],
             r["slowest_shard_p50_ms"], r["latency_p50_ms"], r["latency_p99_ms"], r["qps"]]
            for r in model.get("rows", [])]  # fmt: skip
    show(f"5. MODEL (computed, not measured; {model.get('hop_mode', '-')} hops, {par['replicas']} replicas, "
         f"{par['node_memory_gib']} GiB nodes x {par['usable_fraction']} usable)",
         ["items", "B/item", "GiB", "shards", "nodes", "hop p50 ms", "slowest shard p50 ms", "latency p50 ms",
          "latency p99 ms", "shard q/s (upper bound)"], rows)  # fmt: skip


def csv_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not set(modes) <= set(MODES):
        raise argparse.ArgumentTypeError(f"modes are {', '.join(MODES)}")
    return modes


def csv_ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=100_000, help="vectors of the sharded versions (part 2)")
    p.add_argument("--shards", type=csv_ints, default=[1, 2, 4, 8], help="shard counts (part 2)")
    p.add_argument("--centres", type=int, default=2000, help="rendered products centring the vectors")
    p.add_argument("--queries", type=int, default=1000, help="real captions: half tune, half measure")
    p.add_argument("--search-repeat", type=int, default=2, help="passes over the test queries when timing")
    p.add_argument("--exact-max-items", type=int, default=0, help="indexer's exact-index limit (0: HNSW)")
    p.add_argument("--memory-budget-mb", type=int, default=4096, help="index budget, split over the shards")
    p.add_argument("--requests", type=int, default=300, help="timed sequential requests per path")
    p.add_argument("--warmup", type=int, default=30, help="untimed requests per path first")
    p.add_argument("--hop-shards", type=csv_ints, default=[2, 4, 8], help="no-op shards behind a router")
    p.add_argument("--modes", type=csv_modes, default=list(MODES), help="serving modes: default,fast")
    p.add_argument("--ray-nodes", type=int, default=2, help="Ray nodes of the serving children")
    p.add_argument("--ray-node-cpus", type=float, default=2, help="logical CPUs per Ray node")
    p.add_argument("--replica-cpus", type=float, default=0.1, help="Ray CPUs per no-op replica")
    p.add_argument("--skip-serve", action="store_true", help="leave out part 3 (the real app)")
    p.add_argument("--serve", action="store_true", help="with --quick: keep part 3")
    p.add_argument("--skip-hops", action="store_true", help="leave out parts 1 and 3")
    p.add_argument("--serve-shards", type=int, default=2, help="shards of part 3's version")
    p.add_argument("--build-items", type=int, default=2048, help="catalogue items built (part 4, 3)")
    p.add_argument("--build-shard-size", type=int, default=64, help="items per encoding shard")
    p.add_argument("--build-threads", type=int, default=2, help="local engine: encoder threads")
    p.add_argument("--build-workers", type=int, default=2, help="local engine: decode worker processes")
    p.add_argument("--ray-actors", type=int, default=2, help="ray engine: encoder actors")
    p.add_argument("--ray-cpus-per-actor", type=float, default=1.0, help="ray engine: CPUs per actor")
    p.add_argument("--ray-actor-threads", type=int, default=1, help="ray engine: encoder threads per actor")
    p.add_argument("--skip-build", action="store_true", help="leave out part 4 (part 3 still builds)")
    p.add_argument("--model-items", type=csv_ints, default=[10_000_000, 100_000_000])
    p.add_argument("--node-memory-gib", type=float, default=128.0)
    p.add_argument("--usable-fraction", type=float, default=0.7)
    p.add_argument("--replicas", type=int, default=2, help="replicas of each shard in the model")
    p.add_argument("--model-draws", type=int, default=20_000)
    p.add_argument("--quick", action="store_true", help="tiny everything (a smoke run); writes to /tmp")
    p.add_argument("--out", type=Path, default=None, help="the JSON file (default bench/results/...)")
    p.add_argument("--child", choices=("serving", "build"), help=argparse.SUPPRESS)
    p.add_argument("--child-spec", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:  # part 3 (the real app) adds ~15 s: in a smoke run only with --serve
        args.skip_serve = not args.serve
        args.items, args.shards, args.centres, args.queries, args.search_repeat = 4000, [1, 2], 100, 100, 1
        args.requests, args.warmup, args.hop_shards, args.ray_nodes = 40, 5, [2], 1
        args.build_items, args.build_shard_size, args.model_draws = 48, 16, 2000
    today = date.today().isoformat()
    if args.out is None:
        name = f"cluster_scaling-quick-{today}.json" if args.quick else f"cluster_scaling-{today}.json"
        args.out = (Path(tempfile.gettempdir()) if args.quick else REPO / "bench" / "results") / name
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        spec = json.loads(args.child_spec.read_text())
        out = child_serving(spec) if args.child == "serving" else child_build(spec)
        args.child_out.write_text(json.dumps(out))
        return
    from importlib.metadata import version

    import faiss

    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "cluster_scaling", "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine(),
                    "load_avg_start": os.getloadavg()},
        "versions": {"ray": version("ray"), "faiss": faiss.__version__},
        "parameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                       if not k.startswith("child")},
        "fast_path_env": FAST_PATH_ENV,
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="ccrk-cluster-scaling-") as tmp_name:
        tmp = Path(tmp_name)
        # HAProxy's admin socket path must stay short (a Unix socket path has at most 107 bytes).
        hap_dir = Path(tempfile.mkdtemp(prefix="ccrk-hap-", dir="/tmp"))
        try:
            report["builds"] = bench_builds(args, tmp)
            print(json.dumps({"builds": report["builds"]}), file=sys.stderr, flush=True)
            centres, queries, shape, synth_s = synth_inputs(args)
            report["shards"], raw = bench_shards(args, tmp, centres, queries, synth_s)
            report["serving"] = {}
            if not args.skip_hops:
                spec: dict[str, Any] = {
                    "nodes": args.ray_nodes, "node_cpus": args.ray_node_cpus,
                    "replica_cpus": args.replica_cpus, "hop_shards": args.hop_shards,
                    "requests": args.requests, "warmup": args.warmup,
                    "serve": not args.skip_serve, "serve_shards": args.serve_shards,
                }  # fmt: skip
                if not args.skip_serve:
                    spec |= serve_spec(args, tmp, report["builds"]["source"])
                for mode in args.modes:
                    env, isolation = fast_env(hap_dir) if mode == "fast" else ({}, {})
                    work = tmp / f"child-{mode}"
                    result = run_child("serving", spec | {"mode": mode}, env | isolation, work)
                    result["env"], result["isolation_env"] = env, isolation
                    if mode == "fast" and (strays := kill_strays(str(hap_dir))):
                        result["stray_processes_ended"] = strays
                    report["serving"][mode] = result
                    print(json.dumps({"serving": {mode: result}}), file=sys.stderr, flush=True)
            try:
                report["model"] = model_rows(args, report["shards"], raw, report["serving"], shape)
            except ValueError as exc:  # e.g. no fan-out measured (--hop-shards '')
                report["model"] = {"label": "model", "skipped": str(exc)}
        finally:
            kill_strays(str(hap_dir))
            shutil.rmtree(hap_dir, ignore_errors=True)
    report["machine"]["load_avg_end"] = os.getloadavg()
    report["duration_s"] = round(time.perf_counter() - started, 1)
    text = json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n", encoding="utf-8")
    print_tables(report)
    print(f"\nwritten: {args.out} ({report['duration_s']} s)")


def serve_spec(args: argparse.Namespace, tmp: Path, source: str) -> dict[str, Any]:
    """Part 3's version (``--serve-shards`` shards of the build catalogue, local engine) and app settings."""
    from search_load import queries

    from indexer.build import build

    root = tmp / "serve-index"
    build(
        "served",
        [Path(source)],
        settings=Settings(**build_settings(root, args, index_shards=args.serve_shards)),
    )
    # The service as `ccrk serve --engine ray` runs it, minus what would blur the timing: no cache, no
    # re-ranking, no live exact-search samples, no index polling.
    settings = {
        "model_dir": str(DEFAULT_MODEL_DIR), "backend": "onnx", "device": "cpu", "threads": 1,
        "index_root": str(root), "index_name": "served", "redis_url": None, "cache_size": 0, "rerank": False,
        "ann_sample_rate": 0.0, "index_poll_s": 3600.0, "search_workers": 2,
        "history_db": str(tmp / "history.sqlite"), "ray_shard_cpus": 0.25, "ray_ingress_cpus": 0.5,
    }  # fmt: skip
    return {"settings": settings, "texts": queries(200)}


if __name__ == "__main__":
    main()
