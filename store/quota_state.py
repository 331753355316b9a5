"""The daily quota counters kept under the index root, so a spent quota outlives a Redis restart:
``INDEX_ROOT/.quota/YYYYMMDD.json``, ``{"format": 1, "day": "YYYYMMDD", "used": {identity: requests}}``.

Counts only grow within a day, so processes merge by taking each identity's largest count: ``merge_counts``
takes an exclusive ``flock`` on ``.quota/.lock``, reads the day's file, merges, and writes it atomically
(``store.layout.write_atomic``: readers see the old file or the new one). Files of days before yesterday are
removed as it writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path

from store.layout import write_atomic

QUOTA_DIR = ".quota"
FORMAT = 1


class QuotaStateError(ValueError):
    """A quota state file that cannot be read (not JSON, not of this format); the message names it."""


def quota_path(root: Path, day: str) -> Path:
    return Path(root) / QUOTA_DIR / f"{day}.json"


def read_counts(path: Path) -> dict[str, int]:
    """The counts of one day's file; none when there is no file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise QuotaStateError(f"cannot read quota state {path.name}: {exc}") from exc
    used = data.get("used") if isinstance(data, dict) else None
    if not isinstance(used, dict) or data.get("format") != FORMAT:
        raise QuotaStateError(f"{path.name} is not a quota state file of format {FORMAT}")
    return {str(k): int(v) for k, v in used.items() if isinstance(v, int) and not isinstance(v, bool)}


def merge_counts(root: Path, day: str, counts: Mapping[str, int]) -> dict[str, int]:
    """``counts`` merged into the day's file (each identity's largest count kept); the merged counts. An
    unreadable file is replaced by the merge of what is known (counts can only have been lower)."""
    path = quota_path(root, day)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            merged = read_counts(path)
        except QuotaStateError:
            merged = {}
        for identity, used in counts.items():
            if used > merged.get(identity, 0):
                merged[identity] = used
        body = json.dumps({"format": FORMAT, "day": day, "used": merged}, separators=(",", ":"))
        write_atomic(path, body.encode())
        for old in path.parent.glob("*.json"):
            if old.stem.isdigit() and len(old.stem) == 8 and old.stem < _day_before(day):
                with contextlib.suppress(OSError):
                    old.unlink()
    return merged


def _day_before(day: str) -> str:
    return (datetime.strptime(day, "%Y%m%d") - timedelta(days=1)).strftime("%Y%m%d")
