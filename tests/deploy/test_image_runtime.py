"""What the images run, run here without Docker: the package built from exactly the files the Dockerfile
copies carries the default model and the pages; and with the training stack absent (as in the images, which
install deploy/requirements/ only), the container commands work end to end: draw a catalogue, make a
probe set, build an index, serve it on a real uvicorn, answer search, pages and health checks."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.deploy.deployment import IMAGE_ABSENT_MODULES, REPO, copies, dockerfile_stages

# Module names of the distributions the images leave out (the training stack, Ray).
ABSENT = ",".join(IMAGE_ABSENT_MODULES.values())
# Runs `ccrk ARGS` with those modules unimportable: `import torch` raises ImportError, as in the image.
CCRK = (
    "import sys\n"
    "for name in sys.argv[1].split(','):\n"
    "    sys.modules[name] = None\n"
    "sys.argv = ['ccrk', *sys.argv[2:]]\n"
    "from ccrk_cli.main import app\n"
    "app()\n"
)


def ccrk(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CCRK, ABSENT, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )


def image_like_env(tmp_path: Path) -> dict[str, str]:
    """The machine's environment less any CCRK_ variable, plus the settings the image and compose set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")}
    env.update(
        PYTHONPATH=str(REPO),
        OMP_NUM_THREADS="1",
        CCRK_HOST="127.0.0.1",
        CCRK_INDEX_ROOT=str(tmp_path / "indexes"),
        CCRK_INDEX_NAME="demo",
        CCRK_HISTORY_DB=str(tmp_path / "state" / "monitoring.sqlite"),
        CCRK_PROBE_SET=str(tmp_path / "data" / "probes.jsonl"),
        CCRK_THREADS="1",
        CCRK_INDEX_WORKERS="0",
        CCRK_SEARCH_WORKERS="1",
    )
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_package_built_from_the_copied_files_holds_the_model_and_pages(tmp_path: Path) -> None:
    """`pip install --no-deps .` in the build stage, here: a wheel built from the files the stage copies."""
    build = dockerfile_stages(REPO / "Dockerfile")[0]
    src = tmp_path / "src"
    for copy in copies(build):  # Docker's rules: a folder's contents go into the destination
        for source in copy.sources:
            origin = REPO / source.rstrip("/")
            dest = src / copy.dest.relative_to("/src")
            if origin.is_dir():
                shutil.copytree(
                    origin, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                into = copy.dest_text.endswith("/") or len(copy.sources) > 1
                target = dest / origin.name if into else dest
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(src),
            "-w",
            str(tmp_path / "wheel"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    model = "model/pretrained/ccrk-demo"
    for required in (
        f"{model}/config.json",
        f"{model}/tokenizer.json",
        f"{model}/onnx/export.json",
        f"{model}/onnx/text_encoder.onnx",
        f"{model}/onnx/image_encoder.onnx",
        f"{model}/onnx/fusion_scorer.onnx",
        "ccrk_cli/main.py",
        "ccrk_settings/reference.py",
        "indexer/build.py",
        "store/version/reader.py",
        "monitoring/gate.py",
        "monitoring/cli.py",
        "service/app.py",
        "synthetic/synth.py",  # `ccrk data synth`, the demo container's first command
    ):
        assert required in names, required
    # The pages' templates and assets (package data, not Python modules).
    for folder in ("service/web/templates", "service/web/static"):
        on_disk = {p.relative_to(REPO).as_posix() for p in (REPO / folder).iterdir() if p.is_file()}
        assert on_disk and on_disk <= names, sorted(on_disk - names)


def test_container_commands_run_without_the_training_stack(tmp_path: Path) -> None:
    env = image_like_env(tmp_path)
    data = tmp_path / "data"
    # The indexer job of docker-compose.yml, as the image runs it.
    steps = [
        ("data", "synth", "--out", str(data), "--n-train", "0", "--n-val", "0", "--n-test", "40"),
        (
            "probe",
            "make-set",
            "--catalogue",
            str(data / "test.jsonl"),
            "--out",
            env["CCRK_PROBE_SET"],
            "--n",
            "20",
        ),
        (
            "index",
            "build",
            "--name",
            "demo",
            str(data / "test.jsonl"),
            "--json-report",
            str(tmp_path / "b.json"),
        ),
    ]
    for args in steps:
        out = ccrk(*args, env=env, cwd=tmp_path)
        assert out.returncode == 0, f"ccrk {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
    report = json.loads((tmp_path / "b.json").read_text(encoding="utf-8"))
    assert report["published"] and report["count"] == 40
    assert (tmp_path / "indexes" / "demo" / "CURRENT").read_text().strip() == report["version"]

    # The api service: `ccrk serve` on a real uvicorn, same missing modules.
    port = free_port()
    env["CCRK_PORT"] = str(port)
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-c", CCRK, ABSENT, "serve"],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            deadline = time.monotonic() + 90
            while True:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "not ready after 90 s"
                time.sleep(0.2)
            assert client.get("/healthz").json()["status"] == "ok"
            assert client.get("/readyz").json()["index_version"] == report["version"]
            item = json.loads((data / "test.jsonl").read_text(encoding="utf-8").splitlines()[7])
            query = item["captions"]["de"][0]
            hits = client.post("/v1/search", json={"query": query, "top_k": 10}).json()["results"]
            assert item["id"] in [h["id"] for h in hits], (query, hits)
            image = client.get(f"/v1/images/{item['id']}")
            assert image.status_code == 200 and image.headers["content-type"] == "image/png"
            for page in ("/", "/dashboard"):
                response = client.get(page)
                assert response.status_code == 200 and "<html" in response.text, page
            assert client.get("/vendor/plotly.min.js").status_code == 200
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        finally:
            log.close()
    # A graceful stop (uvicorn re-raises the SIGTERM it handled, hence -15), as `docker stop` would do.
    served = (tmp_path / "serve.log").read_text()
    assert proc.returncode in (0, -15) and "Application shutdown complete" in served, served


@pytest.mark.parametrize("module", IMAGE_ABSENT_MODULES.values())
def test_the_import_block_really_blocks(module: str, tmp_path: Path) -> None:
    """The harness above proves nothing unless `import MODULE` fails under it."""
    script = CCRK.split("sys.argv = ")[0] + f"import {module}\n"
    out = subprocess.run([sys.executable, "-c", script, ABSENT], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and f"ModuleNotFoundError: import of {module} halted" in out.stderr
