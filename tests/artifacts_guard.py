"""The guard that keeps the suite off the checkout's ``artifacts/`` (what ``make demo`` builds and serves):
a test that read the demo's probe history there failed after ``make demo``. ``tests/conftest.py`` installs
it: an audit hook names every open, SQLite connection and folder change under ``artifacts/`` in the test
processes, and a listing before and after the session catches subprocesses (``ccrk serve``, builds) that
created or removed anything there."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Audit events that touch a path (``sys.addaudithook``), and the positions of the paths in their arguments.
PATH_EVENTS: dict[str, tuple[int, ...]] = {
    "open": (0,),
    "sqlite3.connect": (0,),
    "os.listdir": (0,),
    "os.scandir": (0,),
    "os.mkdir": (0,),
    "os.rmdir": (0,),
    "os.remove": (0,),
    "os.rename": (0, 1),
    "os.replace": (0, 1),
    "os.symlink": (1,),
    "shutil.rmtree": (0,),
}
# A running demo service's SQLite opens and drops these beside its history: not the suite's doing.
SIDECARS = ("-wal", "-shm", "-journal")


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def artifact_access(event: str, args: tuple[object, ...], artifacts: Path) -> str | None:
    """The path under ``artifacts`` that the audit event ``event`` touches; None when it touches none."""
    positions = PATH_EVENTS.get(event)
    if positions is None:
        return None
    for i in positions:
        if i >= len(args):
            continue
        path = args[i]
        if isinstance(path, (str, bytes, os.PathLike)) and not isinstance(path, int):
            text = os.fsdecode(os.fspath(path))
            if text.startswith("file:"):  # a SQLite URI
                text = text[5:].split("?", 1)[0]
            if text and text != ":memory:" and _inside(os.path.abspath(text), str(artifacts)):
                return text
    return None


def listing(artifacts: Path) -> set[str]:
    """Every file and folder under ``artifacts`` (relative paths), SQLite's own sidecar files left out."""
    found: set[str] = set()
    for folder, dirs, files in os.walk(artifacts):
        for name in (*dirs, *files):
            if not name.endswith(SIDECARS):
                found.add(os.path.relpath(os.path.join(folder, name), artifacts))
    return found


def listing_change(before: set[str], after: set[str]) -> list[str]:
    """What the session created (+) or removed (-) under ``artifacts``."""
    return [f"+ {p}" for p in sorted(after - before)] + [f"- {p}" for p in sorted(before - after)]


def screenshots_dir() -> Path:
    """Where the browser tests save their screenshots: the temporary folder, not ``artifacts/``."""
    return Path(tempfile.gettempdir()) / "ccrk-test-screenshots"
