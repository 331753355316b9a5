"""A short way through the app for the commonest request, ``POST /v1/search`` with a valid JSON body.

FastAPI's request machinery (the content-type parse, the exit stacks, solving the dependency graph, its
body validation and the layers around the route) cost about as much CPU per text search as the search did
(py-spy under load, 100k items: ~25 % of the process's Python time between the router and the endpoint).
This layer sits where the router is called, inside the app's exception layer, and answers a request that it
can tell is ordinary in the same way the route would: the same dependencies (``get_caller``,
``search_caller``), called in the same order, the same endpoint (``routes.search.search``), so the same
answers and the same typed errors (raised into the exception handlers as before).

Everything else goes to the router with the request body replayed, as if this layer were not there: another
path or method, a content type other than ``application/json``, no Content-Length or one over the route's
limit, a body that is not JSON or does not validate as a ``SearchRequest``. Those checks have no side effects
(no key looked up, no token of the rate limit taken), so FastAPI then answers exactly as it always did: for
an invalid body with an unknown key, the 401 of the dependencies before the 422 of the body.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.deps import get_caller, search_caller
from service.api.routes import search as search_routes
from service.schemas import SearchRequest

PATH = "/v1/search"


def _route_of(app: FastAPI) -> Any:
    """The APIRoute of ``POST /v1/search`` (what the metrics middleware reads from ``scope["route"]``)."""
    for route in search_routes.router.routes:
        if getattr(route, "path", None) == PATH and "POST" in getattr(route, "methods", ()):
            return route
    raise LookupError(f"no POST {PATH} route")


class TextSearchFastPath:
    """Wraps the app's router (``install``)."""

    def __init__(self, app: ASGIApp, router: Any, route: Any, limit: int) -> None:
        self.app = app
        self.router = router
        self.route = route
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] != PATH
            or scope.get("root_path")
        ):
            await self.app(scope, receive, send)
            return
        content_type = length = None
        for name, value in scope["headers"]:
            if name == b"content-type" and content_type is None:
                content_type = value
            elif name == b"content-length" and length is None:
                length = value
            elif name == b"transfer-encoding":
                length = b"-"  # a chunked body: the router's own reading
        if (
            content_type is None
            or content_type.lower() != b"application/json"
            or length is None
            or not length.isdigit()
            or int(length) > self.limit
        ):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        chunks: list[bytes] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # a disconnect: the router meets it too
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        request: SearchRequest | None = None
        if messages[-1]["type"] == "http.request" and len(body) <= self.limit:
            try:
                request = SearchRequest.model_validate(json.loads(body))
            except Exception:  # not JSON (a RecursionError too, nested deep), or invalid: the router's answer
                request = None
        if request is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        scope["route"], scope["endpoint"], scope["path_params"] = self.route, self.route.endpoint, {}
        scope.setdefault("router", self.router)
        http = Request(scope, receive, send)
        runtime = http.app.state.runtime
        headers = http.headers  # as the security schemes read them (an empty value: not sent)
        authorization, api_key = headers.get("authorization") or None, headers.get("x-api-key") or None
        caller = await get_caller(http, runtime, authorization, api_key)
        caller = await search_caller(http, runtime, caller)
        response = await search_routes.search(request, runtime, caller, http)
        await response(scope, receive, send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` giving ``messages`` first (what this layer read of the request), then the connection's."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def install(app: FastAPI) -> None:
    """Put the fast path around the app's router (inside its exception layer, so a typed error raised here
    is answered by the same handler as one raised in the route)."""
    router = app.router
    router.middleware_stack = TextSearchFastPath(
        router.middleware_stack, router, _route_of(app), search_routes.JSON_BODY_LIMIT
    )
