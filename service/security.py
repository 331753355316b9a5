"""Answers that give nothing away: security headers on every response, and server paths kept out of
error messages.

Headers (pure ASGI, added when a response starts): ``X-Content-Type-Options: nosniff``,
``Referrer-Policy: no-referrer``, ``X-Frame-Options: DENY`` and a Content-Security-Policy that allows only
the service's own scripts, styles, images and API (the pages load no CDN: plotly.js and the API docs'
assets are served locally). The API docs page initialises Swagger UI with an inline script, so it alone
gets ``'unsafe-inline'`` scripts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "connect-src 'self'; font-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
DOCS_CONTENT_SECURITY_POLICY = CONTENT_SECURITY_POLICY.replace(
    "script-src 'self'", "script-src 'self' 'unsafe-inline'"
)
DOCS_PATHS = ("/docs", "/redoc")
_COMMON = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = DOCS_CONTENT_SECURITY_POLICY if scope["path"] in DOCS_PATHS else CONTENT_SECURITY_POLICY

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(k, v) for k, v in _COMMON if k not in present]
                if b"content-security-policy" not in present:
                    headers.append((b"content-security-policy", policy.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class Redactor:
    """Replaces server paths (the index root, the model directory) in messages sent to clients: a 503's
    reason should say what is wrong without mapping the server's disk."""

    def __init__(self, paths: Iterable[tuple[Path, str]]) -> None:
        pairs: list[tuple[str, str]] = []
        for path, label in paths:
            for form in {str(path), str(Path(path).resolve())}:
                if form not in ("", ".", "/"):
                    pairs.append((form, label))
        # Longest first (nested paths); whole path components only: "/data" must not touch "/database".
        self._patterns = [
            (re.compile(rf"(?<![\w.-]){re.escape(path)}(?![\w.-])"), label)
            for path, label in sorted(pairs, key=lambda pair: -len(pair[0]))
        ]

    def __call__(self, text: str) -> str:
        for pattern, label in self._patterns:
            text = pattern.sub(label, text)
        return text
