"""A real ``ccrk index build`` process killed with SIGKILL mid-build; the same command then continues
from the completed shards without re-encoding them, and the result equals a direct encoding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from ccrk_settings import DEFAULT_MODEL_DIR
from indexer.decode import Decoder
from indexer.staging import index_lock
from model.configs import CCRkConfig
from model.runtime import Encoder
from store.version.reader import IndexVersion
from store.version.versions import current_version
from tests.conftest import REPO_ROOT
from tests.indexer.files import write_photo
from tests.indexer.killing import kill_after_shards

N_IMAGES = 160
SHARD = 4


def _command(folder: Path, root: Path, report: Path) -> list[str]:
    return [
        sys.executable, "-m", "ccrk_cli.main", "index", "build", "--name", "r", "--index-root", str(root),
        "--threads", "1", "--workers", "1", "--batch-size", "4", "--json-report", str(report), str(folder),
    ]  # fmt: skip


def test_build_resumes_after_sigkill(tmp_path: Path, encoder: Encoder) -> None:
    folder = tmp_path / "photos"
    # Large enough JPEGs that decoding keeps the build busy for a second or more.
    paths = [write_photo(folder / f"{i:03d}.jpg", i, (480, 360)) for i in range(N_IMAGES)]
    root = tmp_path / "indexes"
    env = {**os.environ, "CCRK_SHARD_SIZE": str(SHARD), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        _command(folder, root, tmp_path / "first.json"), cwd=REPO_ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    shards_glob = "r/.builds/build-*/shards/shard-*.npz"
    written = kill_after_shards(proc, root, shards_glob, 3)
    assert 3 <= written < N_IMAGES // SHARD
    assert current_version(root, "r") is None  # nothing published by the killed build
    work = next(root.glob("r/.builds/build-*"))
    result = subprocess.run(
        _command(folder, root, tmp_path / "second.json"),
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "second.json").read_text())
    # Exactly the shards complete at the kill were taken over (counted after the process died).
    assert report["resumed_shards"] == written and report["shards"] == N_IMAGES // SHARD
    assert report["count"] == N_IMAGES and report["published"]
    assert not work.exists()  # the work folder goes once the version is published

    with IndexVersion.open(root, "r") as idx:
        decoder = Decoder(CCRkConfig.load(DEFAULT_MODEL_DIR / "config.json").vision, 10**8)
        want = encoder.encode_images(np.stack([decoder(str(p))[0] for p in paths])).embeds
        ids = [it["id"] for it in idx.items(range(N_IMAGES))]
        assert ids == [p.name for p in paths]
        np.testing.assert_allclose(np.load(idx.path / "embeddings.npy"), want, atol=1e-5)


def test_the_lock_removes_temp_files_of_killed_shard_writers(tmp_path: Path) -> None:
    """A writer killed mid-write leaves ``.shard-N.<host>.<pid>.tmp`` (never overwritten: the name is its
    own); the next operation on the index removes it and keeps the finished shard files (the resume)."""
    shards = tmp_path / "shop" / ".builds" / "build-0123abcd" / "shards"
    shards.mkdir(parents=True)
    finished = shards / "shard-000000.npz"
    finished.write_bytes(b"a finished shard")
    orphan = shards / ".shard-000001.node-2.4242.tmp"
    orphan.write_bytes(b"half a shard")
    with index_lock(tmp_path, "shop"):
        assert not orphan.exists()
    assert finished.read_bytes() == b"a finished shard"
