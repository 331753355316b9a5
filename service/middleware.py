"""Pure ASGI middleware (no per-request task or body copy, unlike BaseHTTPMiddleware)."""

from __future__ import annotations

from time import perf_counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import Metrics


class MetricsMiddleware:
    """Latency histogram by route template, method, status class and query language (set by the text
    search route in ``request.state.lang``).

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
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            lang = (scope.get("state") or {}).get("lang", "")
            self.metrics.request_seconds.labels(route, scope["method"], f"{status // 100}xx", lang).observe(
                perf_counter() - start
            )
