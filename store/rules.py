"""An index's merchandising rules on disk: ``INDEX_ROOT/NAME/rules.json``, beside the versions, so that they
outlive rebuilds (a version folder is immutable and pruned; the rules are the shop's, not a build's).

Format (``RULES_FORMAT`` 1)::

    {"format": 1, "rules": [{"id": "...", "query": "...", "threshold": 0.8, "actions": [...],
                             "enabled": true, ...}, ...]}

The store keeps each rule as the plain JSON object the service validated (``service.rule_schemas``); it
checks only the frame here (an object per rule, a unique string id), so that a hand-edited file cannot make
a reader crash. Writes are atomic (``layout.write_atomic``: readers see the old file or the new one), and a
read-modify-write holds ``rules_lock`` (an ``flock`` on ``.rules.lock``), so two server processes editing
rules at once do not lose each other's change. Readers poll cheaply with ``layout.file_signature`` (one
``stat``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from store.errors import IndexFormatError
from store.layout import FileSignature, file_signature, index_dir, write_atomic

RULES_FILE = "rules.json"
RULES_LOCK = ".rules.lock"
RULES_FORMAT = 1
MAX_RULES_BYTES = 4 << 20  # far above what the service's limits let through; a stray file is not read whole


@dataclass(frozen=True)
class RulesFile:
    """The rules as read: plain JSON objects in file order, and what identifies this content."""

    rules: tuple[dict[str, Any], ...]
    etag: str  # sha256 of the file's bytes, "" without a file: the result cache's key reads it
    signature: FileSignature

    def get(self, rule_id: str) -> dict[str, Any] | None:
        return next((r for r in self.rules if r["id"] == rule_id), None)


EMPTY = RulesFile((), "", None)


def rules_path(root: Path, name: str) -> Path:
    return index_dir(root, name) / RULES_FILE


def rules_beside(version_dir: Path) -> Path:
    """The rules file of the index a version folder belongs to (a version's folder sits in its index's)."""
    return Path(version_dir).parent / RULES_FILE


def read_rules_file(path: Path) -> RulesFile:
    """The rules in ``path``; ``EMPTY`` when there is none. IndexFormatError (naming the file) for one that
    is not such a file: the service then keeps serving without rules rather than failing searches."""
    before = file_signature(path)
    if before is None:
        return EMPTY
    size = before[1]  # (inode, size, mtime_ns)
    if size > MAX_RULES_BYTES:
        raise IndexFormatError(f"{path}: {size} bytes, more than a rules file holds ({MAX_RULES_BYTES})")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return EMPTY
    except OSError as exc:
        raise IndexFormatError(f"cannot read {path}: {exc}") from exc
    try:
        parsed = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise IndexFormatError(f"{path} is not JSON: {exc}") from None
    if not isinstance(parsed, dict) or parsed.get("format") != RULES_FORMAT:
        raise IndexFormatError(f"{path}: not a rules file of format {RULES_FORMAT}")
    rules = parsed.get("rules")
    if not isinstance(rules, list) or not all(
        isinstance(r, dict) and isinstance(r.get("id"), str) for r in rules
    ):
        raise IndexFormatError(f"{path}: 'rules' must be a list of objects, each with a string 'id'")
    ids = [r["id"] for r in rules]
    if len(set(ids)) != len(ids):
        raise IndexFormatError(f"{path}: rule ids repeat")
    # The signature of the bytes read: a file replaced between the stat and the read is seen again next poll.
    return RulesFile(tuple(rules), hashlib.sha256(data).hexdigest(), before)


def read_rules(root: Path, name: str) -> RulesFile:
    return read_rules_file(rules_path(root, name))


def write_rules(root: Path, name: str, rules: list[dict[str, Any]]) -> RulesFile:
    """Replace the index's rules atomically (an empty list leaves an empty rules file, not none). The index
    folder must exist: rules are written for an index, never create one."""
    base = index_dir(root, name)
    if not base.is_dir():
        raise IndexFormatError(f"no index {name!r} under {root}")
    data = json.dumps({"format": RULES_FORMAT, "rules": rules}, ensure_ascii=False, indent=1).encode("utf-8")
    path = base / RULES_FILE
    write_atomic(path, data)
    return RulesFile(tuple(rules), hashlib.sha256(data).hexdigest(), file_signature(path))


@contextmanager
def rules_lock(root: Path, name: str) -> Iterator[None]:
    """Held around a read-modify-write of the rules: one writer at a time across processes (readers need
    no lock: the file is replaced atomically)."""
    base = index_dir(root, name)
    if not base.is_dir():
        raise IndexFormatError(f"no index {name!r} under {root}")
    fd = os.open(base / RULES_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
