"""What the service and monitoring tests share: a small synthetic catalogue encoded by the real demo model
(ONNX), index versions written through the store's own writer, the app under a real uvicorn on
loopback, and a per-session key prefix in a real Redis for the tests that are about Redis.

Fixtures are defined here and registered by each test package's conftest (which imports them), so that
no test package imports another's conftest.
"""

from __future__ import annotations

import socket
import tempfile
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
from model.runtime import EncodedImages, Encoder, load_encoder
from service.app import create_app
from store.layout import FORMAT_VERSION, INDEX_FILE, MANIFEST_FILE, sha256_file
from store.version.manifest import IndexManifest, model_fingerprint, model_name_of
from store.version.writer import VersionWriter
from synthetic.catalogue import CatalogueRecord, load_split
from synthetic.synth import SynthConfig, generate_catalogue

N_ITEMS = 60
INDEX_NAME = "shop"
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
    rerank_policy: dict[str, object] | None = None,
) -> str:
    """One index version of (a subset of) the catalogue, through the store's own writer; ``rerank_policy``
    (``indexer.rerank_policy.RerankPolicy.to_dict()``) goes into the manifest as a build records it."""
    rows = list(range(len(catalogue.records))) if rows is None else rows
    embeds = np.ascontiguousarray(catalogue.encoded.embeds[rows], dtype=np.float32)
    tokens = catalogue.encoded.tokens[rows].astype(np.float16)
    with VersionWriter(root, name) as writer:
        index = faiss.index_factory(embeds.shape[1], "Flat", faiss.METRIC_INNER_PRODUCT)
        index.add(embeds)
        writer.write_index(index)
        writer.save_arrays(embeds, tokens)
        records = [catalogue.records[r] for r in rows]
        writer.write_metadata(
            (n, r.id, str(r.image), dict(r.attributes or {}), False) for n, r in enumerate(records)
        )
        manifest = IndexManifest(
            format_version=FORMAT_VERSION,
            name=name,
            version=writer.version,
            created_at="2026-11-22T00:00:00Z",
            model_name=model_name_of(DEFAULT_MODEL_DIR),
            model_fingerprint=fingerprint or model_fingerprint(DEFAULT_MODEL_DIR),
            embed_dim=embeds.shape[1],
            preprocessing={"image_size": 64, "mean": [0.5] * 3, "std": [0.25] * 3},
            count=len(rows),
            index_factory="Flat",
            search_params={},
            measured_recall_at_10=1.0,
            language_recall_at_10={"en": 0.99, "de": 0.98},
            build_seconds=0.0,
            skipped=[],
            checksums={},
            rerank={
                "dtype": "fp16",
                "tokens": tokens.shape[1],
                "width": tokens.shape[2],
                "bytes_per_image": 0,
                **({} if rerank_policy is None else {"policy": rerank_policy}),
            },
            parent_version=None,
            total_rows=len(rows),
        )
        return writer.finish(manifest, publish=publish).version


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
        # Every test client is 127.0.0.1, and many send wrong keys on purpose: the default (30 a minute)
        # is tested on a server of its own (tests/service/test_auth_throttle.py).
        "auth_failures_per_minute": 100_000,
        # A history file of its own, not artifacts/monitoring.sqlite in the checkout.
        "history_db": Path(tempfile.mkdtemp(prefix="ccrk-test-history-")) / "history.sqlite",
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
    """A key prefix of this session in the test Redis, removed at the end. Only tests about Redis ask for
    it; they fail (not skip) without one, which .ci/run starts."""
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
def server(tmp_path_factory: pytest.TempPathFactory, index_root: Path) -> Iterator[LiveServer]:
    """The main server: the catalogue index, re-ranking off unless asked, in-process caches and a SQLite
    history of its own (no Redis: the tests on it are not about Redis; the Redis cache has its own)."""
    history = tmp_path_factory.mktemp("history") / "monitoring.sqlite"
    with LiveServer(make_settings(index_root, history_db=history)) as live:
        yield live


def reseal_changed_shard(shard: Path) -> Path:
    """Flip the last byte of a published shard's index file and seal its manifest afresh over it: a shard
    changed since its version was published, whose own manifest still agrees with its files (only the
    version's recorded digest of that manifest tells). Returns the changed file."""
    changed = shard / INDEX_FILE
    data = bytearray(changed.read_bytes())
    data[-1] ^= 0xFF
    changed.write_bytes(bytes(data))
    manifest = IndexManifest.load(shard / MANIFEST_FILE)
    manifest.checksums = {**manifest.checksums, INDEX_FILE: sha256_file(changed)}
    manifest.save(shard / MANIFEST_FILE)
    return changed
