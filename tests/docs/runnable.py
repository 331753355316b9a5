"""The shell blocks a page marks as runnable, and a sandbox that runs them as a reader would.

A page marks a fenced ``bash`` block with an HTML comment on the line before it (invisible on GitHub and in
the site): ``<!-- runnable -->`` runs to completion and must exit 0; ``<!-- runnable: background -->`` is a
server the reader leaves running (``make demo``, ``ccrk serve``): it is started, waited for until
``/readyz`` answers 200, and stopped when the page is done.

The sandbox is the layout of a fresh clone after ``make install``: the Makefile and the files its install
target depends on, and the installed ``.venv`` (a link to this checkout's). Everything the blocks write
(catalogues, indexes, models, history) lands in the sandbox. The blocks' port 8000 becomes a free loopback
port (``CCRK_PORT`` and ``DEMO_PORT`` carry it to the commands); nothing else in them is changed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
MARK = re.compile(r"^<!-- runnable(?::\s*(?P<kind>background))?\s*-->\s*$")
FENCE = re.compile(r"^```(?P<lang>\w*)\s*$")
# How the pages name the demo service's address.
ADDRESS = re.compile(r"\b(?:localhost|127\.0\.0\.1):8000\b")
# Every curl fails on an HTTP error (a reader sees the error body; the test must see the failure).
PRELUDE = 'set -euo pipefail\ncurl() { command curl --fail-with-body --max-time 120 "$@"; }\n'
# What the sandbox needs from the checkout: the Makefile, and what its install target depends on.
CLONE_FILES = ("Makefile", "pyproject.toml", "constraints.txt")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the fence
    code: str
    background: bool

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def runnable_blocks(path: Path) -> list[Block]:
    """The marked blocks of a Markdown page, in order; a mark not followed by a ``bash`` fence is an error."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    for i, line in enumerate(lines):
        mark = MARK.match(line)
        if not mark:
            continue
        fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if fence is None or fence.group("lang") not in ("bash", "sh"):
            raise ValueError(f"{path.name}:{i + 1}: a runnable mark must be followed by a ```bash block")
        end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
        code = "\n".join(lines[i + 2 : end]) + "\n"
        blocks.append(Block(path.name, i + 2, code, mark.group("kind") == "background"))
    return blocks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def json_values(text: str) -> list[Any]:
    """Every JSON value in ``text``, one after another (curl prints several bodies back to back)."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        value, i = decoder.raw_decode(text, i)
        values.append(value)
    return values


@dataclass
class Ran:
    block: Block
    stdout: str
    stderr: str


@dataclass
class Sandbox:
    root: Path
    port: int = field(default_factory=free_port)
    extra_env: dict[str, str] = field(default_factory=dict)
    _servers: list[tuple[subprocess.Popen, Path]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in CLONE_FILES:
            shutil.copy(REPO / name, self.root / name)
            # Older than the installed venv: make's install target has nothing to do (as after `make
            # install` in a clone), and never reinstalls into this checkout's venv.
            os.utime(self.root / name, (0, 0))
        (self.root / ".venv").symlink_to(REPO / ".venv", target_is_directory=True)

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")}
        # This checkout's code, whichever checkout the venv's editable install points at.
        env["PYTHONPATH"] = str(REPO)
        env.update(CCRK_PORT=str(self.port), DEMO_PORT=str(self.port), **self.extra_env)
        return env

    def install_is_done(self) -> str | None:
        """None when ``make install`` has nothing to do here; else why not (the venv was not made by it)."""
        out = subprocess.run(
            ["make", "-n", "install"], cwd=self.root, env=self.env, capture_output=True, text=True, timeout=60
        )
        if "pip install" in out.stdout:
            return f"{REPO / '.venv'} was not installed by `make install` (make would install again)"
        return None

    def script(self, block: Block) -> str:
        return PRELUDE + ADDRESS.sub(f"127.0.0.1:{self.port}", block.code)

    def run(self, block: Block, timeout: float = 600) -> Ran:
        if block.background:
            self.start(block, timeout)
            return Ran(block, "", "")
        proc = subprocess.run(
            ["bash", "-c", self.script(block)],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, (
            f"{block} failed (exit {proc.returncode}):\n{block.code}\n--- stdout\n{proc.stdout[-3000:]}"
            f"\n--- stderr\n{proc.stderr[-3000:]}"
        )
        return Ran(block, proc.stdout, proc.stderr)

    def start(self, block: Block, timeout: float) -> None:
        log = self.root / f"server-{len(self._servers)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", self.script(block)],
                cwd=self.root,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: make and the server it starts stop together
            )
        self._servers.append((proc, log))
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.port}/readyz"
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    f"{block} exited ({proc.returncode}) before serving:\n{log.read_text()[-3000:]}"
                )
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{block} not ready after {timeout:.0f} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)

    def stop(self) -> None:
        for proc, _ in self._servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
        self._servers.clear()

    def run_page(self, blocks: list[Block]) -> list[Ran]:
        try:
            return [self.run(block) for block in blocks]
        finally:
            self.stop()
