"""Connections that hold a process without sending a request: time limits for the request head and body,
and a cap on open connections, for uvicorn's httptools protocol.

uvicorn times out idle keep-alive connections only after a response; a connection that never sends a full
request head (silent, or trickling a byte at a time) was held until the fd limit (an outside test kept 410
for 45 s). Here every connection must deliver its request head within ``http_header_timeout_s`` of
connecting (or of the previous response), and its body must keep arriving: no more than
``http_body_timeout_s`` without body bytes (an inactivity limit, so a large upload on a slow link is fine;
the clock stops while the server itself has paused reading); otherwise it is closed. ``max_connections``
is uvicorn's ``limit_concurrency`` (503 beyond it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ccrk_settings import Settings

log = logging.getLogger("uvicorn.error")


def guarded_protocol(header_timeout_s: float, body_timeout_s: float) -> type[asyncio.Protocol]:
    """An httptools protocol class closing connections that are slow to send a request."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def _arm(self, seconds: float, what: str) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._expire, what)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self, what: str) -> None:
            self._deadline = None
            if (
                what == "body" and self.flow.read_paused
            ):  # waiting on us (a pipelined request), not the client
                self._arm(body_timeout_s, what)
                return
            if not self.transport.is_closing():
                log.info("closing a connection from %s: no complete request %s in time", self.client, what)
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm(header_timeout_s, "head")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._deadline is None:  # a next request on a kept-alive connection
                self._arm(header_timeout_s, "head")

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._arm(body_timeout_s, "body")

        def on_body(self, body: bytes) -> None:
            super().on_body(body)
            self._arm(body_timeout_s, "body")  # bytes keep coming: the inactivity clock restarts

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedHttpToolsProtocol


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.Config`` / ``uvicorn.run`` for the connection limits."""
    return {
        "http": guarded_protocol(settings.http_header_timeout_s, settings.http_body_timeout_s),
        "timeout_keep_alive": settings.http_keep_alive_s,
        "limit_concurrency": settings.max_connections,
        "timeout_graceful_shutdown": 10,
    }
