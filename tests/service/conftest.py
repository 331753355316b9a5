"""Fixtures of the service tests: a small synthetic catalogue encoded by the real demo model (ONNX), index
versions written with the shared format module, real uvicorn servers on loopback, real Redis."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import faiss
import httpx
import numpy as np
import pytest
import redis
import uvicorn
from PIL import Image

from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from indexer import index_format as fmt
from model.data.catalogue import CatalogueRecord, load_split
from model.data.synth import SynthConfig, generate_catalogue
from model.runtime import EncodedImages, Encoder, load_encoder
from service.app import create_app

N_ITEMS = 60
INDEX_NAME = "shop"
REPO = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/13"  # a db of its own; keys under a per-session prefix


@dataclass
class Catalogue:
    records: list[CatalogueRecord]
    encoded: EncodedImages

    def ids(self) -> list[str]:
        return [r.id for r in self.records]


@pytest.fixture(scope="session")
def encoder() -> Encoder:
    return load_encoder(DEFAULT_MODEL_DIR, backend="onnx", threads=1)


@pytest.fixture(scope="session")
def catalogue(tmp_path_factory: pytest.TempPathFactory, encoder: Encoder) -> Catalogue:
    out = tmp_path_factory.mktemp("synth")
    generate_catalogue(out, SynthConfig(seed=7, n_train=0, n_val=0, n_test=N_ITEMS), workers=1)
    records = load_split(out / "test.jsonl")
    images = []
    for record in records:
        with Image.open(record.image) as image:
            images.append(image.convert("RGB"))
    return Catalogue(records, encoder.encode_images(images))


def write_version(
    root: Path,
    catalogue: Catalogue,
    *,
    rows: list[int] | None = None,
    fingerprint: str | None = None,
    publish: bool = True,
    name: str = INDEX_NAME,
) -> str:
    """One index version of (a subset of) the catalogue, through the format module's own writers."""
    rows = list(range(len(catalogue.records))) if rows is None else rows
    embeds = np.ascontiguousarray(catalogue.encoded.embeds[rows], dtype=np.float32)
    tokens = catalogue.encoded.tokens[rows].astype(np.float16)
    version = fmt.new_version_name(root, name)
    stage = root / name / fmt.BUILDS_DIR / version
    stage.mkdir(parents=True)
    index = faiss.index_factory(embeds.shape[1], "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(embeds)
    faiss.write_index(index, str(stage / fmt.INDEX_FILE))
    np.save(stage / fmt.EMBEDDINGS_FILE, embeds)
    np.save(stage / fmt.RERANK_FILE, tokens)
    records = [catalogue.records[r] for r in rows]
    fmt.write_metadata(
        stage / fmt.METADATA_FILE,
        ((n, r.id, str(r.image), dict(r.attributes or {}), False) for n, r in enumerate(records)),
    )
    fmt.IndexManifest(
        format_version=fmt.FORMAT_VERSION,
        name=name,
        version=version,
        created_at="2026-11-22T00:00:00Z",
        model_name=fmt.model_name_of(DEFAULT_MODEL_DIR),
        model_fingerprint=fingerprint or fmt.model_fingerprint(DEFAULT_MODEL_DIR),
        embed_dim=embeds.shape[1],
        preprocessing={"image_size": 64, "mean": [0.5] * 3, "std": [0.25] * 3},
        count=len(rows),
        index_factory="Flat",
        search_params={},
        measured_recall_at_10=1.0,
        language_recall_at_10={"en": 0.99, "de": 0.98},
        build_seconds=0.0,
        skipped=[],
        checksums=fmt.file_checksums(stage),
        rerank={"dtype": "fp16", "tokens": tokens.shape[1], "width": tokens.shape[2], "bytes_per_image": 0},
        parent_version=None,
        total_rows=len(rows),
    ).save(stage / fmt.MANIFEST_FILE)
    fmt.install_version(root, name, stage, version)
    if publish:
        fmt.publish_version(root, name, version)
    return version


@pytest.fixture(scope="session")
def index_root(tmp_path_factory: pytest.TempPathFactory, catalogue: Catalogue) -> Path:
    """A read-only index root with one published version of the whole catalogue."""
    root = tmp_path_factory.mktemp("indexes")
    write_version(root, catalogue)
    return root


def make_settings(index_root: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "model_dir": DEFAULT_MODEL_DIR,
        "backend": "onnx",
        "device": "cpu",
        "threads": 1,
        "index_root": index_root,
        "index_name": INDEX_NAME,
        "redis_url": None,
        "rerank": False,
        "index_poll_s": 0.2,
        "admin_api_key": "test-admin-key",
        "search_workers": 2,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


class LiveServer:
    """The app under a real uvicorn on a loopback port, in a thread of this process."""

    def __init__(self, settings: Settings) -> None:
        self.app = create_app(settings)
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on"))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)


@pytest.fixture(scope="session")
def redis_prefix() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"the tests need Redis at 127.0.0.1:6379 ({exc}); .ci/run starts one")
    prefix = f"ccrk-test-{uuid.uuid4().hex[:8]}:"
    yield prefix
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(scope="session")
def server(index_root: Path, redis_prefix: str) -> Iterator[LiveServer]:
    """The main server: the catalogue index, Redis cache, re-ranking off unless asked."""
    with LiveServer(make_settings(index_root, redis_url=REDIS_URL, cache_prefix=redis_prefix)) as live:
        yield live


@pytest.fixture()
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisProcess:
    """A redis-server of our own (no persistence) that a test may stop and start again."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server binary not found")
        self.binary = binary
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


class ServeProcess:
    """A real `ccrk serve` process on a free loopback port (environment without the caller's CCRK_*),
    ready once /readyz answers 200; terminated on exit."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, ready_s: float = 90.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["serve", "--port", str(self.port), "--log-level", "warning", *args]
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")}
        self.env = {**clean, "CCRK_THREADS": "1", **(env or {})}
        self.ready_s = ready_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __enter__(self) -> ServeProcess:
        ccrk = str(Path(sys.executable).parent / "ccrk")
        self.proc = subprocess.Popen(
            [ccrk, *self.args], cwd=REPO, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + self.ready_s
        while True:
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise AssertionError(f"ccrk {' '.join(self.args)} did not become ready")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
