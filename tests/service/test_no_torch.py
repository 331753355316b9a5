"""With the ONNX Runtime backend the serving process never imports torch (they slow each other down)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.service.conftest import REDIS_URL, free_port

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import sys, threading, time, socket
import httpx, uvicorn
from pathlib import Path
from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from service.app import create_app

settings = Settings(model_dir=DEFAULT_MODEL_DIR, backend="onnx", threads=1, index_root=Path(sys.argv[1]),
                    index_name="shop", rerank=True)
server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning"))
sock = socket.socket(); sock.bind(("127.0.0.1", 0))
thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
thread.start()
while not server.started:
    time.sleep(0.02)
url = f"http://127.0.0.1:{sock.getsockname()[1]}"
r = httpx.post(url + "/v1/search", json={"query": "drei gelbe Regenschirme", "rerank": True}, timeout=30)
assert r.status_code == 200 and r.json()["reranked"], r.text
server.should_exit = True
thread.join(60)  # the lifespan's shutdown ends before the interpreter does (native libraries in use)
assert not thread.is_alive(), "the server did not stop"
print("TORCH_MODULES=" + ",".join(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))))
"""


def test_app_startup_and_search_import_no_torch(index_root: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(index_root)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("TORCH_MODULES="))
    assert line == "TORCH_MODULES=", line


def test_ccrk_serve_process_maps_no_torch_library(index_root: Path, redis_prefix: str) -> None:
    """The real `ccrk serve` process: after a search, no torch shared library is mapped into it."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")}
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "ccrk"),
            "serve",
            "--port",
            str(port),
            "--index-root",
            str(index_root),
            "--index-name",
            "shop",
            "--backend",
            "onnx",
            "--redis-url",
            REDIS_URL,
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env={**env, "CCRK_THREADS": "1", "CCRK_CACHE_PREFIX": redis_prefix},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "ccrk serve did not become ready"
            time.sleep(0.1)
        r = httpx.post(url + "/v1/search", json={"query": "tři žluté deštníky", "rerank": True}, timeout=30)
        assert r.status_code == 200 and r.json()["language"]["code"] == "cs"
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "onnxruntime" in maps  # the check can see libraries at all
        assert "/torch/" not in maps
    finally:
        proc.terminate()
        proc.wait(timeout=30)
