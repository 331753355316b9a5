"""Pure ASGI middleware (no per-request task or body copy, unlike BaseHTTPMiddleware)."""

from __future__ import annotations

import logging
from time import perf_counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import Metrics

log = logging.getLogger(__name__)


class MetricsMiddleware:
    """Latency histogram by route template, method, status class and query language (set by the text
    search route in ``request.state.lang``); and the ``RateLimit-*`` headers of an admitted search.

    This is the request layer's telemetry, kept here because it times every route, searches or not; what
    a search itself did (stage timings, re-ranking, match quality, live traffic) is recorded by
    ``service.search.telemetry``."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                # A search's fair-share state (service.runtime.Runtime.admit): routes build their own
                # responses, which a dependency cannot add headers to.
                limits = (scope.get("state") or {}).get("ratelimit_headers")
                if limits and status < 400:
                    extra = [(k.lower().encode(), v.encode()) for k, v in limits.items()]
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            lang = (scope.get("state") or {}).get("lang", "")
            self.metrics.request_seconds.labels(route, scope["method"], f"{status // 100}xx", lang).observe(
                perf_counter() - start
            )


INTERNAL_ERROR_BODY = b'{"detail":[{"loc":[],"msg":"internal error","type":"internal"}]}'


class LastResortMiddleware:
    """Outside every other layer (Starlette's error handler included): an exception that escaped the app is
    logged here and swallowed. Starlette answers it with a 500 and then re-raises; uvicorn, seeing an
    exception after the response, closed the connection, so the client's next request on it was reset. When
    no response has started yet, the 500 is sent from here."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception:
            log.exception("unhandled error answering %s %s", scope.get("method"), scope.get("path"))
            if started:
                return  # the 500 was sent (Starlette's handler); the connection stays usable
            await send_tracked(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(INTERNAL_ERROR_BODY)).encode()),
                    ],
                }
            )
            await send_tracked({"type": "http.response.body", "body": INTERNAL_ERROR_BODY})
