"""With the ONNX Runtime backend the serving process never imports torch (they slow each other down)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.service.conftest import ServeProcess

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


def test_ccrk_serve_process_maps_no_torch_library(index_root: Path, tmp_path: Path) -> None:
    """The real `ccrk serve` process: after a search, no torch shared library is mapped into it. (Its caches
    are in-process: the Redis client is imported either way, and this is not a test of Redis.)"""
    index = ("--index-root", str(index_root), "--index-name", "shop")
    history = {"CCRK_HISTORY_DB": str(tmp_path / "monitoring.sqlite")}  # not the checkout's artifacts/
    with ServeProcess(*index, "--backend", "onnx", env=history) as served:
        url = served.url
        r = httpx.post(url + "/v1/search", json={"query": "tři žluté deštníky", "rerank": True}, timeout=30)
        assert r.status_code == 200 and r.json()["language"]["code"] == "cs"
        maps = Path(f"/proc/{served.pid}/maps").read_text()
        assert "onnxruntime" in maps  # the check can see libraries at all
        assert "/torch/" not in maps
