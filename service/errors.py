"""Typed service errors, mapped to HTTP answers only at the edge (``install_error_handlers``).

Inside the service code raises these (or the index format's own errors); the handlers turn them into JSON
``{"detail": [{"loc": [...], "msg": ..., "type": ...}]}``, the same shape FastAPI uses for its 422s, so a
client reads every error the same way and always learns which field was wrong.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from store.errors import FilterError, IndexFormatError

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """Base of the errors the service answers with a 4xx/5xx (never an unhandled 500)."""

    status_code = 500
    error_type = "service_error"

    def __init__(self, message: str, *, loc: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc

    def body(self) -> dict[str, object]:
        loc = [part if isinstance(part, int) else echo_safe(str(part)) for part in self.loc]
        return {"detail": [{"loc": loc, "msg": echo_safe(self.message), "type": self.error_type}]}


class InvalidInputError(ServiceError):
    """A request field holds a value the service cannot use; ``loc`` names the field."""

    status_code = 422
    error_type = "invalid_input"


class PayloadTooLargeError(ServiceError):
    status_code = 413
    error_type = "payload_too_large"


class UnsupportedMediaTypeError(ServiceError):
    status_code = 415
    error_type = "unsupported_media_type"


class NotFoundError(ServiceError):
    status_code = 404
    error_type = "not_found"


class ForbiddenError(ServiceError):
    """The resource exists but is not served (e.g. an item's image file became a link out of its folder)."""

    status_code = 403
    error_type = "forbidden"


class UnauthorizedError(ServiceError):
    status_code = 401
    error_type = "unauthorized"


class ScopeError(ServiceError):
    """An API key that is valid but not for this route or catalogue (a search key on an admin route, a key
    of shop A on shop B)."""

    status_code = 403
    error_type = "forbidden"


class RateLimitedError(ServiceError):
    """The caller's token bucket is empty, its daily quota spent, or it has as many expensive requests
    running as it may; ``headers`` carry ``Retry-After`` and ``RateLimit-*``."""

    status_code = 429
    error_type = "rate_limited"

    def __init__(self, message: str, *, headers: dict[str, str], loc: tuple[str | int, ...] = ()) -> None:
        super().__init__(message, loc=loc)
        self.headers = headers


class IndexUnavailableError(ServiceError):
    """No index is loaded (none published yet, or it could not be opened); the message says why."""

    status_code = 503
    error_type = "index_unavailable"


class BusyError(ServiceError):
    """Too many requests of a costly kind at once (image decoding); the client should retry shortly."""

    status_code = 503
    error_type = "busy"
    retry_after_s = 1


class WriteUnavailableError(ServiceError):
    """A product write could not be recorded: the change log did not answer (nothing was written); the
    client should send the same write again after ``Retry-After``."""

    status_code = 503
    error_type = "write_unavailable"
    retry_after_s = 1


class ConflictError(ServiceError):
    """The state on disk does not allow the change (a rules file that cannot be read: fix or delete it)."""

    status_code = 409
    error_type = "conflict"


class ReloadFailedError(ServiceError):
    """A requested reload could not open the new version; the old one keeps serving."""

    status_code = 409
    error_type = "reload_failed"


class ReloadOutOfMemoryError(ReloadFailedError):
    """A reload ran out of memory opening or loading the new version: the server's state, not surely the
    version's, so a 503, not a 409. The poller tries the version CURRENT names again, never refusing it
    (with nothing served at each poll; with another version served after a wait that doubles,
    ``service.index_holder.MEMORY_RETRY_S``); a version CURRENT does not name is tried only when asked again.
    The old one keeps serving.
    ``retry_after_s``: its ``Retry-After``, the index poll interval (the admin route sets it from the
    settings; None: no header)."""

    status_code = 503
    error_type = "reload_out_of_memory"

    def __init__(self, message: str, *, loc: tuple[str | int, ...] = ()) -> None:
        super().__init__(message, loc=loc)
        self.retry_after_s: int | None = None


# Characters of a rejected value echoed back in a validation error (a 500 kB query is not worth returning).
ECHO_CHARS = 200


def echo_safe(value: object, depth: int = 0) -> object:
    """A rejected input made safe to put in a JSON answer: lone surrogates and undecodable bytes replaced,
    NaN/Infinity as text, long text cut, deep or large structures summarised. FastAPI's own handler echoes
    the raw input, and a lone surrogate in it made encoding the 422 fail with a 500."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        text = value.encode("utf-8", "replace").decode("utf-8")
        return text if len(text) <= ECHO_CHARS else text[:ECHO_CHARS] + "…"
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if value is None or isinstance(value, bool | int):
        return value if not isinstance(value, int) or abs(value) < 2**63 else str(value)[:ECHO_CHARS]
    if depth >= 3:
        return "…"
    if isinstance(value, Mapping):
        items = list(value.items())[:20]
        return {str(echo_safe(k, depth + 1)): echo_safe(v, depth + 1) for k, v in items}
    if isinstance(value, list | tuple):
        return [echo_safe(v, depth + 1) for v in value[:20]]
    return echo_safe(str(value), depth + 1)


# Places pydantic adds to an error's loc for the member of a union or the validator it tried
# ("function-after[_valid_unicode(), str]", "literal['auto','weak','strong']", "constrained-float", "[key]"):
# names from inside its schema (validator functions with their memory addresses), not the request's fields.
_SCHEMA_LABEL = re.compile(r"[a-z][a-z-]*\[.*\]|constrained-[a-z]+|\[key\]", re.S)


def public_loc(error: Mapping[str, Any]) -> list[str | int]:
    """A validation error's loc without pydantic's schema labels (an extra field's own name is kept)."""
    loc = list(error.get("loc", ()))
    keep = len(loc) - 1 if error.get("type") == "extra_forbidden" else len(loc)
    return [
        part if isinstance(part, int) else str(part)
        for n, part in enumerate(loc)
        if n >= keep or isinstance(part, int) or not _SCHEMA_LABEL.fullmatch(str(part))
    ]


def validation_errors(exc: RequestValidationError) -> list[dict[str, object]]:
    """FastAPI's error list with every echoed part (input, context, message) made safe, its places without
    pydantic's schema labels."""
    return [
        {
            "type": str(error.get("type", "value_error")),
            "loc": [part if isinstance(part, int) else echo_safe(part) for part in public_loc(error)],
            "msg": echo_safe(str(error.get("msg", ""))),
            **({"input": echo_safe(error["input"])} if "input" in error else {}),
            **({"ctx": echo_safe(error["ctx"])} if error.get("ctx") else {}),
        }
        for error in exc.errors()
    ]


def _redacted(request: Request, body: dict[str, object]) -> dict[str, object]:
    """``body`` with server paths replaced (``app.state.redact``, a ``service.security.Redactor``)."""
    redact: Callable[[str], str] | None = getattr(request.app.state, "redact", None)
    if redact is None:
        return body
    for error in body["detail"]:  # type: ignore[attr-defined]
        error["msg"] = redact(str(error["msg"]))
    return body


def install_error_handlers(app: FastAPI) -> None:
    async def request_invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return JSONResponse({"detail": validation_errors(exc)}, status_code=422)

    async def service_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        headers = {"WWW-Authenticate": "ApiKey"} if isinstance(exc, UnauthorizedError) else None
        if isinstance(exc, BusyError | WriteUnavailableError):
            headers = {"Retry-After": str(exc.retry_after_s)}
        if isinstance(exc, ReloadOutOfMemoryError) and exc.retry_after_s is not None:
            headers = {"Retry-After": str(exc.retry_after_s)}
        if isinstance(exc, RateLimitedError):
            headers = exc.headers
        return JSONResponse(_redacted(request, exc.body()), status_code=exc.status_code, headers=headers)

    async def filter_error(request: Request, exc: Exception) -> JSONResponse:
        # The index format names the field in its message; the request field is ``filters``.
        field = getattr(exc, "field", None)
        loc: tuple[str, ...] = ("body", "filters", field) if field else ("body", "filters")
        return JSONResponse(_redacted(request, InvalidInputError(str(exc), loc=loc).body()), status_code=422)

    async def index_error(request: Request, exc: Exception) -> JSONResponse:
        # A broken or vanished index file behind a request: the service cannot answer, the client is fine.
        log.error("index error: %s", exc)
        body = IndexUnavailableError(f"index unavailable: {exc}").body()
        return JSONResponse(_redacted(request, body), status_code=503)

    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        # A bug behind a request: the client learns nothing of it but that it was not its fault. (Starlette
        # calls this from its outermost error layer and re-raises; service.middleware.LastResortMiddleware
        # logs the exception with its traceback.)
        return JSONResponse({"detail": [{"loc": [], "msg": "internal error", "type": "internal"}]}, 500)

    app.add_exception_handler(RequestValidationError, request_invalid)
    app.add_exception_handler(Exception, internal_error)
    app.add_exception_handler(ServiceError, service_error)
    app.add_exception_handler(FilterError, filter_error)
    app.add_exception_handler(IndexFormatError, index_error)
