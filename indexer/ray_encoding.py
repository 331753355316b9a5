"""Encoding a build's shards on a Ray cluster (``--engine ray``): the same shard files as the local engine
(``indexer.shards``), written by Ray Data actors on every node instead of by this process.

    driver: the shards not on disk yet  ->  a Ray Dataset, one row per shard (its index, its items' ids and
            absolute paths)
    ->  map_batches(ShardEncoder, batch_size=1) over a fixed actor pool (SPREAD over the nodes; fractional
        CPUs each, or one GPU each with CUDA): each actor loads the encoder once, then per shard decodes
        with ``indexer.decode.Decoder`` and encodes with ``indexer.shards.encode_shard`` (the local
        engine's own steps, so the rows are the same), and writes the shard file atomically
        (``ShardStore.write``) into the build's work folder
    ->  back to the driver: one small summary per shard (ok count, bad kinds, node), for progress.

The shard files stay the resume checkpoint: a driver killed mid-run is re-run and sends only the shards
whose files are missing. Everything after encoding (reading the shard files, the version, tuning, the gate)
is the local pipeline's. The work folder, the model directory and the images must be reachable at the same
paths on every node (shared storage). ``ray`` is imported lazily: the local engine never needs it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ccrk_settings import Settings
from indexer.decode import Decoder, DecodeResult
from indexer.errors import BuildError
from indexer.shards import ProgressFn, ShardStore, encode_shard
from indexer.sources import SourceItem
from model.model_dir import load_model_config
from model.runtime import load_encoder

# Actor restarts and shard retries after a crash (a node lost, a decoder segfault) before the run fails.
MAX_RETRIES = 3
REACH_TIMEOUT_S = 10.0  # a head that takes longer to accept a TCP connection is taken for absent
# Every pool actor must start (and load its model) within this: a pool the cluster cannot place fails with
# Ray Data's "Timed out while starting actors" instead of waiting forever, and no shard is handed out before
# the whole pool is up (so the shards spread over it).
ACTOR_START_TIMEOUT_S = 600.0
SUMMARY_FIELDS = ("shard", "ok", "bad", "node", "host", "seconds", "error")


@dataclass(frozen=True)
class ShardJob:
    """What every actor of one run needs (sent once, to its constructor): all paths absolute."""

    work_dir: str
    shard_size: int
    total: int
    model_dir: str
    backend: str
    device: str  # "cuda" when the actors hold a GPU, else "cpu"
    threads: int
    int8: bool
    max_pixels: int
    batch_size: int
    rerank_dtype: str


@dataclass
class PoolPlan:
    """The actor pool of one run."""

    actors: int
    cpus: float  # per actor
    gpus: float  # per actor: 0 or 1


@dataclass
class RayEncoding:
    """What a run did: shards found done already, and shards encoded per Ray node (node id -> count)."""

    resumed: int
    nodes: dict[str, int] = field(default_factory=dict)


class ShardEncoder:
    """One actor of the pool: loads the encoder once; each call encodes the shards of its batch (one, with
    ``batch_size=1``) and writes their files. It never raises: a failure comes back as the summary's
    ``error``, naming the shard and the item, so the driver reports it without a Ray traceback."""

    def __init__(self, job: ShardJob) -> None:
        import ray

        self.job = job
        self.node = ray.get_runtime_context().get_node_id()
        self.host = socket.gethostname()
        self.failure = ""
        what = f"the work folder {job.work_dir}"
        try:
            self.store = ShardStore(Path(job.work_dir), job.shard_size, job.total)
            what = f"the model {job.model_dir}"
            self.decoder = Decoder(load_model_config(Path(job.model_dir)).vision, job.max_pixels)
            self.encoder = load_encoder(job.model_dir, job.backend, job.device, job.threads, job.int8)
        except Exception as exc:  # reported with the first shard this actor is given
            self.failure = f"cannot open {what} on {self.host}: {_first_line(exc)}"

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = [
            self.encode(int(index), str(entries))
            for index, entries in zip(batch["shard"], batch["items"], strict=True)
        ]
        return {key: np.asarray([row[key] for row in rows]) for key in SUMMARY_FIELDS}

    def encode(self, index: int, entries_json: str) -> dict[str, Any]:
        """Decode, encode and write shard ``index`` (``entries_json``: its items' [id, path] pairs)."""
        started = time.perf_counter()
        summary: dict[str, Any] = {
            "shard": index, "ok": 0, "bad": "{}", "node": self.node, "host": self.host, "seconds": 0.0,
            "error": self.failure and f"shard {index}: {self.failure}",
        }  # fmt: skip
        if self.failure:
            return summary
        entries: list[list[str]] = json.loads(entries_json)
        at = 0  # the item being decoded or, at a failure in encoding, the last one of the batch

        def decoded() -> Iterator[DecodeResult]:
            nonlocal at
            for k, (_, path) in enumerate(entries):
                at = k
                yield self.decoder(path)

        try:
            shard = encode_shard(
                index,
                decoded(),
                len(entries),
                self.encoder,
                self.job.batch_size,
                self.job.rerank_dtype,
                lambda _: None,
            )
        except Exception as exc:
            item_id, path = entries[at]
            summary["error"] = (
                f"shard {index}, item {item_id!r} ({path}) on {self.host}: {_first_line(exc)}"
                " (a failure in encoding names the last item of its batch)"
            )
            return summary
        try:
            self.store.write(index, shard)
        except Exception as exc:  # e.g. a full disk, or a work folder not shared with this node
            where = f"writing {self.store.path(index)} on {self.host}"
            summary["error"] = f"shard {index}: {where}: {_first_line(exc)}"
            return summary
        kinds = Counter(kind for kind in shard.kinds if kind)
        summary.update(ok=int(shard.ok.sum()), bad=json.dumps(dict(sorted(kinds.items()))))
        summary["seconds"] = round(time.perf_counter() - started, 3)
        return summary


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _import_ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise BuildError(
            f"--engine ray needs Ray ({exc}): install the ray extra, `pip install 'ccrk-search[ray]'`"
        ) from None
    return ray


def plan_pool(settings: Settings, pending: int, nodes: Sequence[dict[str, Any]]) -> PoolPlan:
    """The pool for ``pending`` shards on a cluster of ``nodes`` (``ray.nodes()``): ``ray_actors`` actors,
    or as many as the alive nodes hold at ``ray_cpus_per_actor`` (default ``threads``) CPUs each, or one per
    GPU with CUDA (device cuda, or auto on a cluster with GPUs); never more than ``pending``."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    cpus = float(settings.ray_cpus_per_actor or settings.threads)
    gpus_total = int(sum(r.get("GPU", 0) for r in alive))
    use_gpu = settings.device == "cuda" or (settings.device == "auto" and gpus_total > 0)
    if use_gpu and gpus_total == 0:
        raise BuildError("--engine ray with device cuda: the Ray cluster has no GPU")
    if not any(r.get("CPU", 0) >= cpus for r in alive):
        most = max((r.get("CPU", 0) for r in alive), default=0)
        raise BuildError(
            f"--engine ray: no Ray node has {cpus:g} CPUs for an encoder actor (the largest has {most:g}); "
            "lower CCRK_RAY_CPUS_PER_ACTOR"
        )
    if settings.ray_actors is not None:
        actors = settings.ray_actors
    elif use_gpu:
        actors = gpus_total
    else:
        actors = sum(int(r.get("CPU", 0) // cpus) for r in alive)
    return PoolPlan(actors=max(1, min(actors, pending)), cpus=cpus, gpus=1.0 if use_gpu else 0.0)


def _quiet_ray_data(ray: Any) -> None:
    """No Ray Data progress bars and INFO lines on the console (the caller's progress bar counts the items);
    its warnings (e.g. actors that cannot be placed) still show, and its log file keeps everything."""
    from ray.util.debug import log_once

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    log_once("ray_data_progress_manager_disabled")  # its warning that we turned the bars off: we know
    for handler in logging.getLogger("ray.data").handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setLevel(max(handler.level, logging.WARNING))


def _check_reachable(address: str) -> None:
    """Fail at once on a head that does not answer (Ray itself retries for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise BuildError(f"--address {address!r}: expected HOST:PORT of the Ray head, e.g. 10.0.0.5:6379")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise BuildError(
            f"--engine ray: the Ray head at {address} does not answer ({exc.strerror or exc}); start it with "
            "`ray start --head --port PORT`, or check --address / CCRK_RAY_ADDRESS"
        ) from None


def _connect(ray: Any, address: str | None) -> bool:
    """Attach to (or start) Ray unless this process is attached already; True when this call did."""
    if ray.is_initialized():
        return False
    if address is not None:
        _check_reachable(address)
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    except (ConnectionError, ValueError, RuntimeError) as exc:
        where = address or "RAY_ADDRESS, the local cluster or a new local Ray"
        raise BuildError(f"--engine ray: cannot attach to Ray at {where}: {_first_line(exc)}") from None
    return True


def encode_shards_on_ray(
    items: Sequence[SourceItem],
    store: ShardStore,
    *,
    settings: Settings,
    model_dir: Path,
    rerank_dtype: str,
    progress: ProgressFn | None = None,
) -> RayEncoding:
    """Encode every shard of ``store`` not on disk yet on the Ray cluster of ``settings.ray_address``
    (``indexer.shards.encode_shards``'s counterpart: same files, same rows). Ray is shut down afterwards
    only if this call started or attached it."""
    done = set(store.done())
    pending = [i for i in range(store.count) if i not in done]
    finished = sum(hi - lo for lo, hi in map(store.bounds, done))
    if progress:
        progress(finished, store.total)
    result = RayEncoding(resumed=len(done))
    if not pending:
        return result
    ray = _import_ray()
    attached_here = _connect(ray, settings.ray_address)
    try:
        plan = plan_pool(settings, len(pending), ray.nodes())
        job = ShardJob(
            work_dir=str(Path(store.dir.parent).resolve()),
            shard_size=store.shard_size,
            total=store.total,
            model_dir=str(Path(model_dir).resolve()),
            backend=settings.backend,
            device="cuda" if plan.gpus else "cpu",
            threads=settings.threads,
            int8=settings.int8,
            max_pixels=settings.max_image_pixels,
            batch_size=settings.index_batch_size,
            rerank_dtype=rerank_dtype,
        )
        rows = []
        for i in pending:
            lo, hi = store.bounds(i)
            entries = [[it.id, os.path.abspath(it.path)] for it in items[lo:hi]]
            rows.append({"shard": i, "items": json.dumps(entries)})
        _quiet_ray_data(ray)
        ray.data.DataContext.get_current().wait_for_min_actors_s = ACTOR_START_TIMEOUT_S
        dataset = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
            ShardEncoder,
            batch_size=1,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=plan.actors),
            fn_constructor_kwargs={"job": job},
            num_cpus=plan.cpus,
            num_gpus=plan.gpus or None,
            scheduling_strategy="SPREAD",
            max_restarts=MAX_RETRIES,
            max_task_retries=MAX_RETRIES,
        )
        try:
            for row in dataset.iter_rows():
                if row["error"]:
                    raise BuildError(f"--engine ray: {row['error']}")
                lo, hi = store.bounds(int(row["shard"]))
                finished += hi - lo
                result.nodes[str(row["node"])] = result.nodes.get(str(row["node"]), 0) + 1
                if progress:
                    progress(finished, store.total)
        except BuildError:
            raise
        except Exception as exc:  # Ray's own failures (a node lost, retries used up): one line, no dump
            raise BuildError(
                f"--engine ray: the run failed ({_first_line(exc)}); the shard files written so far are "
                "kept, so a re-run resumes from them"
            ) from None
    finally:
        if attached_here:
            ray.shutdown()
    missing = [i for i in pending if not store.path(i).is_file()]
    if missing:
        raise BuildError(
            f"--engine ray: the actors reported shards {missing[:10]} written, but {store.dir} lacks their "
            "files: the index root must be on storage every node shares, at the same path"
        )
    return result
