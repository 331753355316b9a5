"""``--engine ray`` on a real Ray cluster of three nodes on this machine (``ray.cluster_utils.Cluster``): a
build equals the local build of the same sources (rows, embeddings, re-rank tokens, skipped files) with its
shards encoded on several nodes, and so does an `add`; a driver killed with SIGKILL is re-run and resumes
from the shard files; a failure in an actor names its shard and item; the local engine never imports Ray."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ccrk_settings import Settings, settings_with
from indexer.build import build
from indexer.errors import BuildError
from indexer.ray_encoding import ShardEncoder, ShardJob, _check_reachable, plan_pool
from indexer.report import BuildReport
from store.version.reader import IndexVersion
from store.version.versions import current_version
from tests.conftest import REPO_ROOT
from tests.indexer.files import make_bad_files, write_photo
from tests.indexer.killing import kill_after_shards
from tests.ray_cluster import LOOPBACK_ENV, loopback_cluster

pytestmark = pytest.mark.ray

RAY_SETTINGS = {"engine": "ray", "ray_actors": 3, "ray_cpus_per_actor": 0.5}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Three Ray nodes of 2 logical CPUs on 127.0.0.1, this process attached as a driver."""
    with loopback_cluster(3) as cluster:
        yield cluster


def _sources(catalogue: Path, tmp_path: Path) -> list[Path]:
    """The synthetic catalogue and a folder of two bad files (2 of 42 items: within the 5 % limit)."""
    made = make_bad_files(tmp_path / "all-bad")
    bad = tmp_path / "bad"
    bad.mkdir()
    for kind in ("truncated", "not-an-image"):
        shutil.copy(made[kind], bad / made[kind].name)
    return [catalogue / "test.jsonl", bad]


def _assert_same_version(root_a: Path, root_b: Path, name: str) -> None:
    """Same ids in the same rows, embeddings within 1e-6, equal re-rank tokens and skipped files."""
    with IndexVersion.open(root_a, name) as a, IndexVersion.open(root_b, name) as b:
        assert a.manifest.count == b.manifest.count
        rows = range(a.manifest.count)
        assert [it["id"] for it in a.items(rows)] == [it["id"] for it in b.items(rows)]
        emb_a, emb_b = np.load(a.path / "embeddings.npy"), np.load(b.path / "embeddings.npy")
        np.testing.assert_allclose(emb_a, emb_b, atol=1e-6, rtol=0)
        tok_a, tok_b = np.load(a.path / "rerank_tokens.npy"), np.load(b.path / "rerank_tokens.npy")
        np.testing.assert_array_equal(tok_a, tok_b)
        skipped = [[(s["id"], s["kind"]) for s in v.manifest.skipped] for v in (a, b)]
        assert skipped[0] == skipped[1]


def test_ray_build_equals_the_local_build(
    cluster: Any, catalogue: Path, settings: Settings, tmp_path: Path
) -> None:
    sources = _sources(catalogue, tmp_path)
    # Decoding in this process: no fork beside the Ray driver's threads (the same Decoder either way).
    local = settings_with({"index_root": tmp_path / "local", "shard_size": 6, "index_workers": 0}, settings)
    distributed = settings_with({**RAY_SETTINGS, "index_root": tmp_path / "ray", "shard_size": 6}, settings)
    want = build("c", sources, settings=local)
    seen: list[tuple[int, int]] = []
    got = build("c", sources, settings=distributed, progress=lambda done, total: seen.append((done, total)))
    assert got.published and got.count == want.count == 40 and got.shards == want.shards == 7
    assert got.engine == "ray" and want.engine == "local" and not want.encode_nodes
    assert sum(got.encode_nodes.values()) == 7 and got.resumed_shards == 0
    assert len(got.encode_nodes) >= 2, f"SPREAD put every shard on one node: {got.encode_nodes}"
    assert seen[-1] == (42, 42) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert sorted(s["kind"] for s in got.skipped) == ["not-an-image", "truncated"]
    _assert_same_version(tmp_path / "local", tmp_path / "ray", "c")


def _split(catalogue: Path, tmp_path: Path, first: int) -> tuple[Path, Path]:
    """The catalogue's first ``first`` records and the rest, as two jsonl files with absolute image paths."""
    records = [json.loads(line) for line in (catalogue / "test.jsonl").read_text().splitlines() if line]
    for record in records:
        record["image"] = str(catalogue / record["image"])
    head, tail = tmp_path / "head.jsonl", tmp_path / "tail.jsonl"
    head.write_text("".join(json.dumps(r) + "\n" for r in records[:first]))
    tail.write_text("".join(json.dumps(r) + "\n" for r in records[first:]))
    return head, tail


def test_ray_add_equals_the_local_add(
    cluster: Any, catalogue: Path, settings: Settings, tmp_path: Path
) -> None:
    """`add --engine ray` encodes only the new items on the cluster: the same version as a local add."""
    from indexer.build import add

    head, tail = _split(catalogue, tmp_path, 25)
    local = settings_with({"index_root": tmp_path / "local", "shard_size": 6, "index_workers": 0}, settings)
    distributed = settings_with({**RAY_SETTINGS, "index_root": tmp_path / "ray", "shard_size": 6}, settings)
    for s in (local, distributed):
        assert build("c", [head], settings=settings_with({"engine": "local"}, s)).count == 25
    want = add("c", [tail], settings=local)
    got = add("c", [tail], settings=distributed)
    assert got.published and want.published and got.count == want.count == 40
    assert got.engine == "ray" and sum(got.encode_nodes.values()) == got.shards >= 2
    _assert_same_version(tmp_path / "local", tmp_path / "ray", "c")


def test_a_pool_the_cluster_cannot_place_fails_instead_of_waiting(
    cluster: Any, catalogue: Path, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More 2-CPU actors than the three 2-CPU nodes hold: a BuildError naming the cause once the actors'
    start timeout passes (it waited forever), nothing published."""
    monkeypatch.setattr("indexer.ray_encoding.ACTOR_START_TIMEOUT_S", 3.0)
    greedy = {**RAY_SETTINGS, "index_root": tmp_path / "ray", "shard_size": 2, "ray_actors": 8}
    greedy["ray_cpus_per_actor"] = 2.0
    with pytest.raises(BuildError, match="starting actors"):
        build("c", _sources(catalogue, tmp_path), settings=settings_with(greedy, settings))
    assert current_version(tmp_path / "ray", "c") is None


def _cli(folder: Path, root: Path, report: Path, address: str) -> list[str]:
    return [
        sys.executable, "-m", "ccrk_cli.main", "index", "build", "--name", "r", "--index-root", str(root),
        "--threads", "1", "--batch-size", "4", "--engine", "ray", "--address", address,
        "--json-report", str(report), str(folder),
    ]  # fmt: skip


def test_a_killed_ray_driver_resumes(cluster: Any, settings: Settings, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    n, shard = 96, 4
    for i in range(n):
        write_photo(folder / f"{i:03d}.jpg", i, (480, 360))
    root = tmp_path / "ray"
    env = {
        **os.environ,
        **LOOPBACK_ENV,
        "CCRK_SHARD_SIZE": str(shard),
        "CCRK_RAY_ACTORS": "2",
        "CCRK_RAY_CPUS_PER_ACTOR": "0.5",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO_ROOT),
    }
    command = _cli(folder, root, tmp_path / "first.json", cluster.address)
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    written = kill_after_shards(proc, root, "r/.builds/build-*/shards/shard-*.npz", 1, timeout_s=90, log=log)
    assert 1 <= written < n // shard
    assert current_version(root, "r") is None
    command = _cli(folder, root, tmp_path / "second.json", cluster.address)
    rerun = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    report = json.loads((tmp_path / "second.json").read_text())
    assert report["resumed_shards"] > 0 and report["shards"] == n // shard
    assert report["resumed_shards"] + sum(report["encode_nodes"].values()) == n // shard
    assert report["count"] == n and report["published"] and report["engine"] == "ray"
    local = {"index_root": tmp_path / "local", "shard_size": shard, "index_batch_size": 4, "index_workers": 0}
    build("r", [folder], settings=settings_with(local, settings))
    _assert_same_version(tmp_path / "local", root, "r")


class Failing:
    def __init__(self, encoder: Any) -> None:
        self.config = encoder.config

    def encode_images(self, pixels: np.ndarray) -> Any:
        raise RuntimeError("out of memory\nsecond line")


def test_an_actor_failure_names_its_shard_and_item(cluster: Any, settings: Settings, tmp_path: Path) -> None:
    paths = [str(write_photo(tmp_path / f"{i}.jpg", i)) for i in range(3)]
    job = ShardJob(
        work_dir=str(tmp_path / "work"), shard_size=3, total=6, model_dir=str(settings.model_dir),
        backend="onnx", device="cpu", threads=1, int8=False, max_pixels=10**8, batch_size=2,
        rerank_dtype="fp16",
    )  # fmt: skip
    actor = ShardEncoder(job)  # in this process: the class Ray Data runs as an actor
    ok = actor.encode(1, json.dumps([[f"id{i}", p] for i, p in enumerate(paths)]))
    assert ok["error"] == "" and ok["ok"] == 3 and (tmp_path / "work/shards/shard-000001.npz").is_file()
    actor.encoder = Failing(actor.encoder)  # type: ignore[assignment]
    failed = actor.encode(0, json.dumps([[f"id{i}", p] for i, p in enumerate(paths)]))
    assert failed["error"].startswith(f"shard 0, item 'id1' ({paths[1]})")
    assert "RuntimeError: out of memory" in failed["error"] and "second line" not in failed["error"]
    assert not (tmp_path / "work/shards/shard-000000.npz").exists()


def _node(cpus: float, gpus: float = 0, alive: bool = True) -> dict[str, Any]:
    return {"Alive": alive, "Resources": {"CPU": cpus, "GPU": gpus} if gpus else {"CPU": cpus}}


def test_the_pool_fits_the_cluster(settings: Settings) -> None:
    nodes = [_node(16), _node(8), _node(64, alive=False)]
    two = settings_with({"threads": 2}, base=settings)
    assert (plan_pool(two, 100, nodes).actors, plan_pool(two, 100, nodes).cpus) == (12, 2.0)
    assert plan_pool(two, 5, nodes).actors == 5  # never more actors than shards to encode
    half = settings_with({"ray_cpus_per_actor": 0.5, "ray_actors": 3}, base=settings)
    assert (plan_pool(half, 100, nodes).actors, plan_pool(half, 100, nodes).gpus) == (3, 0.0)
    gpu = settings_with({"device": "auto"}, base=settings)
    assert plan_pool(gpu, 100, [_node(8, 2), _node(8, 1)]).actors == 3
    assert plan_pool(gpu, 100, [_node(8, 2)]).gpus == 1.0
    with pytest.raises(BuildError, match="no GPU"):
        plan_pool(settings_with({"device": "cuda"}, base=settings), 10, nodes)
    with pytest.raises(BuildError, match="no Ray node has 32 CPUs"):
        plan_pool(settings_with({"ray_cpus_per_actor": 32}, base=settings), 10, nodes)


def test_an_unreachable_head_fails_at_once() -> None:
    with socket.socket() as bound:  # bound but not listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(BuildError, match=f"the Ray head at 127.0.0.1:{port} does not answer"):
            _check_reachable(f"127.0.0.1:{port}")
    assert time.monotonic() - started < 5
    with pytest.raises(BuildError, match="expected HOST:PORT"):
        _check_reachable("head-without-port")


LOCAL_BUILD = """
import sys
from ccrk_cli.main import app
try:
    app(sys.argv[1:], standalone_mode=False)
finally:
    loaded = sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))
    print("RAY MODULES:", loaded)
"""


def test_the_local_engine_imports_no_ray(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    for i in range(3):
        write_photo(folder / f"{i}.jpg", i)
    args = ["index", "build", "--name", "l", "--index-root", str(tmp_path / "idx"), "--engine", "local"]
    env = {**os.environ, "CCRK_THREADS": "1", "CCRK_INDEX_WORKERS": "0", "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", LOCAL_BUILD, *args, str(folder)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "RAY MODULES: []" in out.stdout and current_version(tmp_path / "idx", "l") is not None


def test_report_fields_default_to_the_local_engine() -> None:
    report = BuildReport("build", "x", None, False)
    assert report.engine == "local" and report.encode_nodes == {}
