"""Fixtures of the service tests: the shared catalogue, index root and live server (``tests.fixtures``), a
server with the Redis cache for the tests about it, real Redis and `ccrk serve` processes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.fixtures import (
    REDIS_URL,
    LiveServer,
    catalogue,
    encoder,
    index_root,
    make_settings,
    redis_prefix,
    server,
)

__all__ = ["catalogue", "encoder", "index_root", "redis_prefix", "server"]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def redis_server(index_root: Path, redis_prefix: str) -> Iterator[LiveServer]:
    """The catalogue index served with the Redis cache (keys under this session's prefix), for the tests
    of that cache; everything else runs on ``server``, which needs no Redis."""
    # No live ANN-recall sampling: a sample encodes its query through the same cache, and its hit would count
    # among the ones the cache tests assert (a clean-clone run saw 2 embedding hits for one request).
    settings = make_settings(index_root, redis_url=REDIS_URL, cache_prefix=redis_prefix, ann_sample_rate=0.0)
    with LiveServer(settings) as live:
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
