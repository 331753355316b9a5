"""API keys with scopes, stored hashed in one file under the index root (``INDEX_ROOT/api-keys.json``).

A key reads ``ccrk_<id>_<secret>``: ``id`` (8 hex digits) names the record, ``secret`` is 32 random bytes
(URL-safe base64). The file holds, per id, the SHA-256 of the whole key and what the key may do (its scope,
its indexes, its rate, burst and daily quota), never the key itself: a copy of the file lets nobody in.
(A salt buys nothing against 256 random bits: there is no dictionary to precompute.)

Writers (``ccrk keys``) take an exclusive ``flock`` on a lock file beside it, write a temporary file and
``os.replace`` it: readers see the old file or the new one, never half of one. Every server process holds
a ``KeyRing`` that looks at the file's ``stat`` at most every ``check_s`` (0.5 s) and re-reads it when its
inode, size or modification time changed, so a revocation reaches every worker within a second at the cost
of one ``stat`` per half second. A key it does not know costs one ``stat`` more (a key created or rotated a
moment ago works at once; the file is read again only when it changed).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import math
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

KEYS_FILE = "api-keys.json"
KEY_PREFIX = "ccrk_"
FORMAT = 1
Scope = Literal["search", "write", "events", "admin"]
SCOPES: tuple[str, ...] = ("search", "write", "events", "admin")
# What each scope may do: a write key also searches (a back office reads what it wrote); an events key
# searches and sends the shoppers' clicks (``POST /v1/events``: a front end's key); admin does all.
_GRANTS: dict[str, frozenset[str]] = {
    "search": frozenset({"search"}),
    "write": frozenset({"search", "write"}),
    "events": frozenset({"search", "events"}),
    "admin": frozenset({"search", "write", "events", "admin"}),
}
ALL_INDEXES = "*"


class KeyStoreError(ValueError):
    """The keys file cannot be read or changed as asked (a bad value, an unknown id); the message says why."""


@dataclass(frozen=True)
class KeyRecord:
    """What the file keeps of one key."""

    id: str
    digest: str  # sha256 hex of the whole key
    scope: Scope
    indexes: tuple[str, ...]  # index names, or ("*",): every index
    rate: float | None = None  # requests per second; None: the service's default for keys
    burst: int | None = None  # bucket size; None: max(1, rate) (one second's worth)
    quota_per_day: int | None = None  # requests per UTC day; None: no quota
    name: str = ""
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def allows_index(self, index: str) -> bool:
        return ALL_INDEXES in self.indexes or index in self.indexes

    def allows_scope(self, scope: Scope) -> bool:
        """A search key may only search; a write key may also write products (``service.live``); an events
        key may also send events (``service.analytics``); an admin key may do everything."""
        return scope in _GRANTS[self.scope]

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "indexes": list(self.indexes)}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> KeyRecord:
        scope = data.get("scope")
        if scope not in SCOPES:
            raise KeyStoreError(f"key {data.get('id')!r}: scope {scope!r} is not one of {SCOPES}")
        indexes = data.get("indexes") or [ALL_INDEXES]
        rate = None if data.get("rate") is None else float(data["rate"])  # type: ignore[arg-type]
        if rate is not None and not (math.isfinite(rate) and rate > 0):  # NaN, inf or <= 0: no bucket math
            raise KeyStoreError(f"key {data.get('id')!r}: rate {rate!r} is not a positive number")
        for name in ("burst", "quota_per_day"):
            value = data.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise KeyStoreError(f"key {data.get('id')!r}: {name} {value!r} is not a positive integer")
        return cls(
            id=str(data["id"]),
            digest=str(data["digest"]),
            scope=scope,  # type: ignore[arg-type]
            indexes=tuple(str(i) for i in indexes),  # type: ignore[union-attr]
            rate=rate,
            burst=None if data.get("burst") is None else int(data["burst"]),  # type: ignore[call-overload]
            quota_per_day=None if data.get("quota_per_day") is None else int(data["quota_per_day"]),  # type: ignore[call-overload]
            name=str(data.get("name") or ""),
            created_at=str(data.get("created_at") or ""),
        )


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def new_key(key_id: str | None = None) -> tuple[str, str]:
    """(id, key): a fresh random key, of a new id unless one is given (rotation keeps the id)."""
    key_id = key_id or secrets.token_hex(4)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    return key_id, f"{KEY_PREFIX}{key_id}_{secret}"


def key_id_of(key: str) -> str | None:
    """The id a presented key claims (``ccrk_<id>_...``), None when it is not of that form."""
    if not key.startswith(KEY_PREFIX):
        return None
    key_id, sep, secret = key[len(KEY_PREFIX) :].partition("_")
    return key_id if sep and secret and len(key_id) == 8 else None


def keys_path(index_root: Path) -> Path:
    return Path(index_root) / KEYS_FILE


def read_records(path: Path) -> dict[str, KeyRecord]:
    """The records of a keys file; none when there is no file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise KeyStoreError(f"cannot read {path.name}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise KeyStoreError(f"{path.name} is not a keys file (no 'keys' list)")
    try:
        records = [KeyRecord.from_json(entry) for entry in data["keys"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise KeyStoreError(f"{path.name} holds a malformed key: {exc}") from exc
    return {record.id: record for record in records}


class KeyStore:
    """A keys file for the ``ccrk keys`` commands (every change locked and atomic): ``INDEX_ROOT`` (its
    ``api-keys.json``) or the file itself (a path ending in ``.json``)."""

    def __init__(self, where: Path) -> None:
        where = Path(where)
        self.path = where if where.suffix == ".json" else keys_path(where)
        self.root = self.path.parent

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, KeyRecord]]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f".{self.path.name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            records = read_records(self.path)
            yield records
            self._write(records)

    def _write(self, records: dict[str, KeyRecord]) -> None:
        body = json.dumps({"format": FORMAT, "keys": [r.to_json() for r in records.values()]}, indent=1)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.root)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(body + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def records(self) -> list[KeyRecord]:
        return list(read_records(self.path).values())

    def create(
        self,
        scope: str,
        indexes: list[str],
        *,
        rate: float | None = None,
        burst: int | None = None,
        quota_per_day: int | None = None,
        name: str = "",
    ) -> tuple[KeyRecord, str]:
        """A new key: its record and the key itself (shown once, never stored)."""
        if scope not in SCOPES:
            raise KeyStoreError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        if rate is not None and not (0 < rate < 1e9):
            raise KeyStoreError(f"rate must be above 0, got {rate}")
        if burst is not None and burst < 1:
            raise KeyStoreError(f"burst must be at least 1, got {burst}")
        if quota_per_day is not None and quota_per_day < 1:
            raise KeyStoreError(f"quota must be at least 1 a day, got {quota_per_day}")
        for index in indexes:
            if index != ALL_INDEXES and (not index or "/" in index or index.startswith(".")):
                raise KeyStoreError(f"{index!r} is not an index name")
        with self._locked() as records:
            key_id, key = new_key()
            while key_id in records:
                key_id, key = new_key()
            record = KeyRecord(
                id=key_id,
                digest=key_digest(key),
                scope=scope,  # type: ignore[arg-type]
                indexes=tuple(indexes) or (ALL_INDEXES,),
                rate=rate,
                burst=burst,
                quota_per_day=quota_per_day,
                name=name,
            )
            records[key_id] = record
        return record, key

    def _find(self, records: dict[str, KeyRecord], id_or_key: str) -> KeyRecord:
        key_id = key_id_of(id_or_key) or id_or_key
        record = records.get(key_id)
        if record is None:
            raise KeyStoreError(f"no key with id {key_id!r}")
        if key_id != id_or_key and not hmac.compare_digest(record.digest, key_digest(id_or_key)):
            raise KeyStoreError(f"the key given is not the current key of id {key_id!r}")
        return record

    def revoke(self, id_or_key: str) -> KeyRecord:
        with self._locked() as records:
            record = self._find(records, id_or_key)
            del records[record.id]
        return record

    def rotate(self, id_or_key: str) -> tuple[KeyRecord, str]:
        """A new secret for a key's id, scope and limits; the old key stops working."""
        with self._locked() as records:
            old = self._find(records, id_or_key)
            _, key = new_key(old.id)
            record = KeyRecord(**{**old.__dict__, "digest": key_digest(key)})
            records[old.id] = record
        return record, key


class KeyRing:
    """A server process's view of the keys file: looked up per request, re-read when the file changes
    (checked at most every ``check_s``). A file that cannot be read keeps the last good keys (and logs)."""

    def __init__(self, where: Path, check_s: float = 0.5) -> None:
        where = Path(where)
        self.path = where if where.suffix == ".json" else keys_path(where)
        self.check_s = check_s
        self._lock = threading.Lock()
        self._records: dict[str, KeyRecord] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._checked = -float("inf")
        self.last_error: str | None = None

    def refresh(self, *, force: bool = False, stat_now: bool = False) -> None:
        """Re-read the file if it changed, looking at most every ``check_s`` (``stat_now``: look now;
        ``force``: read it whatever its stat)."""
        now = time.monotonic()
        if not force and not stat_now and now - self._checked < self.check_s:
            return
        with self._lock:
            self._checked = now
            try:
                st = os.stat(self.path)
                stamp: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
            except FileNotFoundError:
                stamp = None
            except OSError as exc:
                self.last_error = str(exc)
                return
            if stamp == self._stamp and not force:
                return
            try:
                records = read_records(self.path) if stamp is not None else {}
            except KeyStoreError as exc:
                if str(exc) != self.last_error:  # once per new problem: the last good keys stay in force
                    log.error("keys file %s not loaded, the last good keys stay in force: %s", self.path, exc)
                self.last_error = str(exc)
                return
            self._records, self._stamp, self.last_error = records, stamp, None

    @property
    def has_admin_keys(self) -> bool:
        self.refresh()
        return any(r.scope == "admin" for r in self._records.values())

    def lookup(self, key: str) -> KeyRecord | None:
        """The record of a presented key; None for an unknown, revoked or wrong one."""
        self.refresh()
        key_id = key_id_of(key)
        if key_id is None:
            return None
        record = self._records.get(key_id)
        if record is None or not hmac.compare_digest(record.digest, key_digest(key)):
            # A key created or rotated a moment ago: one stat more (re-read only if the file changed).
            self.refresh(stat_now=True)
            record = self._records.get(key_id)
        if record is None or not hmac.compare_digest(record.digest, key_digest(key)):
            return None
        return record
