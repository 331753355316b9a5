"""Connections that hold a process without sending a request: time limits for the request head and body, a
size limit for the head, and caps on open connections (per process, and per client address), for uvicorn's
httptools protocol.

uvicorn times out idle keep-alive connections only after a response; a connection that never sends a full
request head (silent, or trickling a byte at a time) was held until the fd limit (an outside test kept 410
for 45 s). Here every connection must deliver its request head within ``http_header_timeout_s`` of
connecting (or of the previous response), and its body must keep arriving: no more than
``http_body_timeout_s`` without body bytes (an inactivity limit, so a large upload on a slow link is fine;
the clock stops while the server itself has paused reading), and all of it within ``http_body_total_s`` of
its head (a body sending a byte every 20 s never paused long enough, and was still open at 69 s); otherwise
the connection is closed. A head over ``http_max_head_bytes`` (request line and headers) gets a 431.

``max_connections`` is uvicorn's ``limit_concurrency`` (503 beyond it). One client address may hold at most
``per_client_cap``: ``max_connections_per_client``, and never more than ``max_connections_client_share`` of
``max_connections`` (a quarter by default, so 5 of a cap of 20); beyond it a new connection gets a 503 and
is closed at once, so slow clients from one address cannot fill the process's cap, whatever its size (25
slow bodies from one address made every other client's search a 503 for 120 s with the cap at 20). Behind a
proxy every client has the proxy's address: raise both there.

The answers sent from here (431, and the 503 of an address over its share) carry the security headers of
every other answer (``service.security``), the Content-Security-Policy included.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ccrk_settings import Settings
from service.security import CONTENT_SECURITY_POLICY

log = logging.getLogger("uvicorn.error")
REFUSAL_LINGER_S = 1.0


def _answer(status: bytes, message: str, error_type: str, loc: list[str]) -> bytes:
    """A complete HTTP/1.1 answer that closes the connection, with the service's error body and the
    security headers (it is sent from here, outside the app)."""
    body = json.dumps({"detail": [{"loc": loc, "msg": message, "type": error_type}]}).encode()
    head = [
        b"HTTP/1.1 " + status,
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
        b"x-content-type-options: nosniff",
        b"x-frame-options: DENY",
        b"referrer-policy: no-referrer",
        b"content-security-policy: " + CONTENT_SECURITY_POLICY.encode(),
    ]
    if status.startswith(b"503"):
        head.append(b"retry-after: 1")
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class HeadWithBody:
    """The transport as one response cycle of uvicorn's sees it: the response head (status line and
    headers, written when the app starts its answer) is held back and goes out in one write with the first
    body bytes, or when the response ends or the connection closes. uvicorn writes them separately: two
    segments, and the client is woken twice per answer (at ~600 small answers/s on 2 shared cores, the
    head's send was ~18 % of the event loop's Python time, mostly the client taking the core from the
    server). The bytes sent are the same; an informational ``100 Continue`` is never held."""

    __slots__ = ("_expect_head", "_held", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self._expect_head = True

    def write(self, data: bytes) -> None:
        if self._expect_head and data[:9] == b"HTTP/1.1 " and data[9:10] != b"1":
            self._expect_head = False
            self._held = data
            return
        if self._held is not None:
            data, self._held = self._held + data, None
        self._transport.write(data)

    def flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded_protocol(
    header_timeout_s: float,
    body_timeout_s: float,
    body_total_s: float = float("inf"),
    max_head_bytes: int = 1 << 30,
    max_per_client: int = 1 << 30,
) -> type[asyncio.Protocol]:
    """An httptools protocol class closing connections that are slow to send a request, refusing heads
    over ``max_head_bytes`` and connections over ``max_per_client`` from one address. Each call makes a
    class with its own count of connections per address (one per server)."""
    per_client: dict[str, int] = {}
    too_many = _answer(
        b"503 Service Unavailable",
        f"too many connections from your address (at most {max_per_client}); retry in a moment",
        "busy",
        ["connection"],
    )
    head_too_large = _answer(
        b"431 Request Header Fields Too Large",
        f"the request line and headers are over {max_head_bytes} bytes",
        "header_too_large",
        ["header"],
    )

    class HeadTooLarge(Exception):
        pass

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _total: asyncio.TimerHandle | None = None
        _address: str | None = None  # counted in per_client while set
        _head_bytes = 0  # of the request line and headers, as parsed
        _head_raw = 0  # bytes received while the head is incomplete (a header still growing included)
        _in_head = True
        _refused = False

        def _arm(self, seconds: float, what: str) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._expire, what)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _disarm_total(self) -> None:
            if self._total is not None:
                self._total.cancel()
                self._total = None

        def _refuse(self, answer: bytes) -> None:
            """Send ``answer``, then close gently: the write side at once (the client reads the answer
            to its end), the connection after ``REFUSAL_LINGER_S`` (what the client still sends meanwhile
            is read and dropped; closing with unread bytes would reset the connection, and the client could
            lose the answer). It no longer counts toward the process's connection cap."""
            self._refused = True
            self._disarm()
            self._disarm_total()
            self.connections.discard(self)
            self.transport.write(answer)
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(REFUSAL_LINGER_S, self.transport.close)

        def _close(self, reason: str) -> None:
            if not self.transport.is_closing():
                log.info("closing a connection from %s: %s", self.client, reason)
                self.transport.close()

        def _expire(self, what: str) -> None:
            self._deadline = None
            if (
                what == "body" and self.flow.read_paused
            ):  # waiting on us (a pipelined request), not the client
                self._arm(body_timeout_s, what)
                return
            self._close(f"no complete request {what} in time")

        def _expire_total(self) -> None:
            self._total = None
            if self.flow.read_paused:  # the server is not reading: not the client's time
                self._total = self.loop.call_later(1.0, self._expire_total)
                return
            self._close(f"request body not complete within {body_total_s:g} s")

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else ""
            count = per_client.get(address, 0) + 1
            per_client[address] = count
            self._address = address
            if count > max_per_client:
                self._refused = True
                log.warning("refusing a connection from %s: %d open from that address", address, count - 1)
                self._refuse(too_many)
                return
            self._arm(header_timeout_s, "head")

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            self._unset_keepalive_if_required()
            if self._in_head:
                self._head_raw += len(data)
            try:
                self.parser.feed_data(data)
                if self._in_head and self._head_raw > max_head_bytes:  # one header growing without end
                    self._refused = True
                    raise httptools.HttpParserError
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
            except httptools.HttpParserError:
                if self._refused:  # the head grew over the limit (HeadTooLarge inside the parser's error)
                    self._refuse(head_too_large)
                    return
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)

        def _count_head(self, size: int) -> None:
            self._head_bytes += size
            if self._head_bytes > max_head_bytes:
                self._refused = True
                raise HeadTooLarge

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = 0
            if self._deadline is None:  # a next request on a kept-alive connection
                self._arm(header_timeout_s, "head")

        def on_url(self, url: bytes) -> None:
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_head(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            before = self.cycle
            super().on_headers_complete()
            self._coalesce(before)
            self._arm(body_timeout_s, "body")
            self._disarm_total()
            if body_total_s != float("inf"):
                self._total = self.loop.call_later(body_total_s, self._expire_total)

        def _coalesce(self, before: Any) -> None:
            """The request's cycle (made just now; its task has not run yet) writes through HeadWithBody,
            flushed when its response is complete (a HEAD answer writes no body)."""
            cycle = self.cycle
            if cycle is None or cycle is before:  # no new cycle (an upgrade)
                return
            transport = HeadWithBody(self.transport)
            cycle.transport = transport
            done = cycle.on_response

            def on_response() -> None:
                transport.flush()
                done()

            cycle.on_response = on_response

        def on_body(self, body: bytes) -> None:
            super().on_body(body)
            self._arm(body_timeout_s, "body")  # bytes keep coming: the inactivity clock restarts

        def on_message_complete(self) -> None:
            self._disarm()
            self._disarm_total()
            self._in_head, self._head_raw = True, 0  # what follows is the next request's head
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._disarm_total()
            if self._address is not None:
                left = per_client.get(self._address, 1) - 1
                if left > 0:
                    per_client[self._address] = left
                else:
                    per_client.pop(self._address, None)
                self._address = None
            super().connection_lost(exc)

    return GuardedHttpToolsProtocol


def per_client_cap(settings: Settings) -> int:
    """Connections one client address may hold per process: ``max_connections_per_client``, at most
    ``max_connections_client_share`` of ``max_connections`` (at least one)."""
    share = max(1, int(settings.max_connections * settings.max_connections_client_share))
    return min(settings.max_connections_per_client, share)


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.Config`` / ``uvicorn.run`` for the connection limits."""
    return {
        "http": guarded_protocol(
            settings.http_header_timeout_s,
            settings.http_body_timeout_s,
            body_total_s=settings.http_body_total_s,
            max_head_bytes=settings.http_max_head_bytes,
            max_per_client=per_client_cap(settings),
        ),
        "timeout_keep_alive": settings.http_keep_alive_s,
        "limit_concurrency": settings.max_connections,
        "timeout_graceful_shutdown": 10,
    }
