"""A process-wide budget of the memory image searches hold: the upload's bytes and the decode's frames
(``model.preprocessing.decode_bytes``, from the image's header, before any pixel is decoded).

An image search reserves its cost before it reads the upload or waits for a decoding slot, and gives it
back when it is answered. A search whose cost does not fit waits (up to the image slot wait) for others to
give theirs back, then gets a 503 with Retry-After: the process never holds more than the budget for
uploads, whatever the number of clients. (An outside test took one process from 1,170 to 2,367 MB with 40
clients uploading 46 KB 16-bit PNGs of 24 MP, over the pod's 2 GiB.)

Reservations live on the event loop (one thread): no lock. The request body itself is reserved earlier, by
``UploadBodyMiddleware``, before the framework parses it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Container
from contextlib import asynccontextmanager

import anyio
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import BusyError


class UploadBudget:
    def __init__(self, limit_bytes: int, *, wait_s: float = 10.0) -> None:
        self.limit_bytes = limit_bytes
        self.wait_s = wait_s  # how long a request body waits for its bytes (UploadBodyMiddleware)
        self.used_bytes = 0
        self.peak_bytes = 0
        self._released: anyio.Event | None = None  # made on the event loop, when someone first waits

    async def acquire(self, nbytes: int, *, wait_s: float) -> None:
        """Take ``nbytes`` of the budget; a ``BusyError`` (503, Retry-After) when they are not free within
        ``wait_s`` seconds, at once when they exceed the whole budget."""
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
            if self._released is None:
                self._released = anyio.Event()
            with anyio.move_on_after(remaining):
                await self._released.wait()
        self.used_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    def release(self, nbytes: int) -> None:
        self.used_bytes -= nbytes
        released, self._released = self._released, None
        if released is not None:
            released.set()

    @asynccontextmanager
    async def reserve(self, nbytes: int, *, wait_s: float) -> AsyncIterator[None]:
        """``nbytes`` of the budget held for the block (``acquire``, then ``release``)."""
        await self.acquire(nbytes, wait_s=wait_s)
        try:
            yield
        finally:
            self.release(nbytes)


class UploadBodyMiddleware:
    """Reserves an upload request's body bytes before the framework reads it: Starlette parses a multipart
    body into memory (up to 1 MB a file part, every other field whole) before the route runs, so the
    facade's own reservation (the bytes it reads, the decode) comes too late to bound that part. The body
    of a POST to one of ``paths`` holds ``min(Content-Length, max_body)`` (``max_body`` when not stated)
    until it is answered; a 503 with Retry-After, its body unread, when that does not fit in time."""

    def __init__(self, app: ASGIApp, *, paths: Container[str], max_body: int, budget: UploadBudget) -> None:
        self.app = app
        self.paths = paths
        self.max_body = max_body
        self.budget = budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        stated = dict(scope["headers"]).get(b"content-length", b"")
        nbytes = min(int(stated), self.max_body) if stated.isdigit() else self.max_body
        try:
            await self.budget.acquire(nbytes, wait_s=self.budget.wait_s)
        except BusyError as exc:
            headers = {"Retry-After": str(exc.retry_after_s)}
            await JSONResponse(exc.body(), status_code=exc.status_code, headers=headers)(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.budget.release(nbytes)
