"""A process-wide budget of the memory image searches hold: the upload's bytes and the decode's frames
(``model.preprocessing.decode_bytes``, from the image's header, before any pixel is decoded).

An image search reserves its cost before it reads the upload or waits for a decoding slot, and gives it
back when it is answered. A search whose cost does not fit waits (up to the image slot wait) for others to
give theirs back, then gets a 503 with Retry-After: the process never holds more than the budget for
uploads, whatever the number of clients. (An outside test took one process from 1,170 to 2,367 MB with 40
clients uploading 46 KB 16-bit PNGs of 24 MP, over the pod's 2 GiB.)

Reservations live on the event loop (one thread): no lock.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from service.errors import BusyError


class UploadBudget:
    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.peak_bytes = 0
        self._released = anyio.Event()

    @asynccontextmanager
    async def reserve(self, nbytes: int, *, wait_s: float) -> AsyncIterator[None]:
        """Hold ``nbytes`` of the budget for the block; a ``BusyError`` (503, Retry-After) when they are
        not free within ``wait_s`` seconds, at once when they exceed the whole budget."""
        if nbytes > self.limit_bytes:
            raise BusyError(
                f"this image needs ~{nbytes / 2**20:.0f} MB to decode; this server decodes uploads within "
                f"{self.limit_bytes / 2**20:.0f} MB (send a smaller image)",
                loc=("body", "file"),
            )
        deadline = time.monotonic() + wait_s
        while self.used_bytes + nbytes > self.limit_bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BusyError(
                    "too many image searches at once (their memory budget is in use); retry in a moment",
                    loc=("body", "file"),
                )
            with anyio.move_on_after(remaining):
                await self._released.wait()
        self.used_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)
        try:
            yield
        finally:
            self.used_bytes -= nbytes
            released, self._released = self._released, anyio.Event()
            released.set()
