"""Wake-up sockets (``store.live.wake``): a nudge reaches the named socket and only it; a name that is
gone or not this module's is skipped without an error; a closed socket's name is free again."""

from __future__ import annotations

import select

import pytest

from store.live.wake import WakeSocket, nudge, supported

pytestmark = pytest.mark.skipif(not supported(), reason="abstract Unix socket names are Linux's")


def readable(sock: WakeSocket, timeout: float = 1.0) -> bool:
    return bool(select.select([sock.sock], [], [], timeout)[0])


def test_a_nudge_wakes_the_named_sockets_only() -> None:
    a, b = WakeSocket(), WakeSocket()
    try:
        assert a.name != b.name and a.drain() == 0
        assert nudge([a.name, a.name]) == 2
        assert readable(a) and not readable(b, 0.05)
        assert a.drain() == 2 and a.drain() == 0
        gone = WakeSocket()
        gone.close()
        # A socket gone (a process killed), a foreign name, an empty one: skipped, no error.
        assert nudge([gone.name, "not-ours", "", b.name]) == 1
        assert readable(b) and b.drain() == 1
    finally:
        a.close()
        b.close()
