"""Query ids: what a search answers with and an event names, checked without reading the log.

A query id is ``q`` and 32 URL-safe base64 characters of 24 bytes: the search's time (milliseconds, 6
bytes), 8 random bytes, and the first 10 bytes of an HMAC-SHA256 over those and the index's name, keyed by a
secret that every process of the machine shares (``INDEX_ROOT/.analytics-secret``, 32 random bytes, made
once, readable by its owner only). So an event is judged at once, whichever process or worker answered its
search and whether or not that search's row has been written yet: a forged, altered or other index's id is
unknown; one older than the event window is expired.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path

SECRET_FILE = ".analytics-secret"
SECRET_BYTES = 32
_TIME_BYTES, _NONCE_BYTES, _MAC_BYTES = 6, 8, 10
_ID_BYTES = _TIME_BYTES + _NONCE_BYTES + _MAC_BYTES
PREFIX = "q"


class UnknownQueryIdError(ValueError):
    """Not a query id this machine's service gave for this index."""


class ExpiredQueryIdError(ValueError):
    """A query id older than the event window."""


def load_secret(index_root: Path) -> bytes:
    """The machine's secret, made on first use: written whole to a temporary file, then linked into place
    (a process racing this one links its own or finds this one: never half a file)."""
    path = index_root / SECRET_FILE
    try:
        data = path.read_bytes()
        if len(data) == SECRET_BYTES:
            return data
    except FileNotFoundError:
        pass
    index_root.mkdir(parents=True, exist_ok=True)
    tmp = index_root / f"{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_bytes(SECRET_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    data = path.read_bytes()
    if len(data) != SECRET_BYTES:
        raise OSError(f"{path} holds {len(data)} bytes, not the {SECRET_BYTES} of a query-id secret")
    return data


class QueryIds:
    """Makes and checks one index's query ids."""

    def __init__(self, secret: bytes, index: str) -> None:
        self._secret = secret
        self._index = index.encode()

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._secret, body + b"\0" + self._index, hashlib.sha256).digest()[:_MAC_BYTES]

    def new(self, at: float) -> str:
        body = int(at * 1000).to_bytes(_TIME_BYTES, "big") + secrets.token_bytes(_NONCE_BYTES)
        return PREFIX + base64.urlsafe_b64encode(body + self._mac(body)).decode()

    def check(self, query_id: str, *, now: float, window_s: float) -> float:
        """The search's time of ``query_id``; UnknownQueryIdError or ExpiredQueryIdError."""
        raw = None
        if query_id.startswith(PREFIX) and len(query_id) == len(PREFIX) + _ID_BYTES * 4 // 3:
            try:
                raw = base64.urlsafe_b64decode(query_id[len(PREFIX) :])
            except ValueError:
                raw = None
        if raw is None or len(raw) != _ID_BYTES:
            raise UnknownQueryIdError("not a query id of this index")
        body, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(body)):
            raise UnknownQueryIdError("not a query id of this index")
        at = int.from_bytes(body[:_TIME_BYTES], "big") / 1000.0
        if at < now - window_s:
            raise ExpiredQueryIdError(
                f"the search is {now - at:.0f} s old, past the event window of {window_s:.0f} s"
            )
        return at
