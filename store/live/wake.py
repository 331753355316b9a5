"""Waking the other processes of one machine when a write waits for them: SQLite's ``LISTEN/NOTIFY``.

A writer with ``wait=true`` waits until every process serving the index shows its write
(``store.live.readers``). Each of them polls the log every ``CCRK_LIVE_POLL_S``; waiting for that poll
would cost every such write up to a whole period (a client writing one product after another: 10 writes/s
at 0.1 s). So each process also listens on a Unix datagram socket in Linux's abstract namespace (no file,
nothing to clean up after a ``kill -9``; the kernel frees the name with the process), reports its name on
the reader board, and a waiting writer sends one byte to each reader behind it: the reader's poller wakes
at once and catches up. A lost or refused datagram (a process on another machine, one just killed) costs
only the poll; nothing depends on it.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import uuid
from collections.abc import Iterable

PREFIX = "ccrk-live-"


def supported() -> bool:
    """Abstract Unix socket names are Linux's."""
    return sys.platform.startswith("linux")


class WakeSocket:
    """This process's wake-up socket: bound at construction, non-blocking; ``name`` goes on the board."""

    def __init__(self) -> None:
        self.name = PREFIX + uuid.uuid4().hex
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind("\0" + self.name)
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise

    def drain(self) -> int:
        """Read every pending wake-up; how many there were."""
        count = 0
        while True:
            try:
                self.sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return count
            count += 1

    def close(self) -> None:
        self.sock.close()


def nudge(names: Iterable[str]) -> int:
    """Send a wake-up to each named socket (names that are not this module's are skipped); how many were
    sent. Never raises for a socket that is gone or full."""
    sent = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
        out.setblocking(False)
        for name in names:
            if not name or not name.startswith(PREFIX):
                continue
            with contextlib.suppress(OSError):
                out.sendto(b"1", "\0" + name)
                sent += 1
    return sent
