"""FastAPI dependencies as ``Annotated`` aliases (the routes declare what they need by type).

All are ``async def``: they only read attributes, and FastAPI runs a plain ``def`` dependency in the thread
pool, one thread hop per dependency per request."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator
from typing import Annotated, NoReturn

from fastapi import Depends, Request, Security
from fastapi import Path as PathParam
from fastapi.security import APIKeyHeader

from ccrk_settings import Settings
from service.errors import NotFoundError, RateLimitedError, ScopeError, UnauthorizedError
from service.index_holder import IndexHolder
from service.keys import KeyRecord, Scope
from service.runtime import Caller, Runtime
from service.search.pipeline import SearchPipeline


async def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_settings_dep(runtime: RuntimeDep) -> Settings:
    return runtime.settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


async def get_pipeline(runtime: RuntimeDep) -> SearchPipeline:
    """The loaded model's search pipeline (its name, fingerprint, encoder, re-ranking). Searches do not
    take it: they go through ``runtime.search``, which leases the served version in the worker thread."""
    return runtime.pipeline


PipelineDep = Annotated[SearchPipeline, Depends(get_pipeline)]


def _address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def is_admin_key(key: str, admin_key: str | None) -> bool:
    """Whether ``key`` is the admin key, compared in constant time whatever either's length (their SHA-256
    digests: ``compare_digest`` of the strings themselves returns at once on a length mismatch)."""
    if not admin_key:
        return False
    digests = [hashlib.sha256(k.encode("utf-8", "surrogateescape")).digest() for k in (key, admin_key)]
    return hmac.compare_digest(digests[0], digests[1])


def _throttled(wait_s: int) -> RateLimitedError:
    return RateLimitedError(
        f"too many failed authentications from your address; retry after {wait_s} s",
        headers={"Retry-After": str(wait_s)},
        loc=("header", "authorization"),
    )


def _check_throttle(runtime: Runtime, request: Request) -> None:
    """429 for an address over its failed authentications (``service.auth_throttle``), before its key is
    checked, a right one included."""
    wait = runtime.auth_throttle.blocked(_address(request))
    if wait is not None:
        raise _throttled(wait)


def _refuse(runtime: Runtime, request: Request, error: UnauthorizedError) -> NoReturn:
    """``error`` (401) for a key that did not authenticate, counted; 429 once the address is over."""
    wait = runtime.auth_throttle.failed(_address(request))
    if wait is not None:
        raise _throttled(wait) from None
    raise error


def _presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key of ``Authorization: Bearer KEY``, else of ``X-API-Key``; None when neither is sent."""
    if authorization is not None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthorizedError(
                "the Authorization header must read 'Bearer KEY'", loc=("header", "authorization")
            )
        return token.strip()
    return x_api_key


# Security schemes (not plain headers) so the OpenAPI schema lists them under securitySchemes; both hand
# over the raw header, which ``_presented_key`` reads (a malformed Authorization is a 401 naming it).
_BEARER = APIKeyHeader(
    name="Authorization",
    scheme_name="BearerKey",
    description="`Bearer KEY`: an API key (`ccrk keys create`); or send it as X-API-Key.",
    auto_error=False,
)
_X_API_KEY = APIKeyHeader(
    name="X-API-Key",
    scheme_name="ApiKey",
    description="An API key (`ccrk keys create`), or the admin key (CCRK_ADMIN_API_KEY).",
    auto_error=False,
)
AuthorizationHeader = Annotated[str | None, Security(_BEARER)]
ApiKeyHeader = Annotated[str | None, Security(_X_API_KEY)]


async def get_caller(
    request: Request,
    runtime: RuntimeDep,
    authorization: AuthorizationHeader = None,
    x_api_key: ApiKeyHeader = None,
) -> Caller:
    """Who calls: the key sent (401 when it is unknown or revoked; the keys file is re-read within 0.5 s
    of a change), the admin key, or nobody (the client's address names anonymous traffic)."""
    if authorization is None and x_api_key is None:
        return Caller(identity=f"ip:{_address(request)}", record=None)
    _check_throttle(runtime, request)
    try:
        key = _presented_key(authorization, x_api_key)
    except UnauthorizedError as exc:
        _refuse(runtime, request, exc)
    assert key is not None
    if is_admin_key(key, runtime.settings.admin_api_key):
        return Caller(identity="admin", record=None, admin=True)
    record = runtime.keys.lookup(key)
    if record is None:
        where = "authorization" if authorization is not None else "x-api-key"
        _refuse(runtime, request, UnauthorizedError("unknown or revoked API key", loc=("header", where)))
    return Caller(identity=f"key:{record.id}", record=record)


CallerDep = Annotated[Caller, Depends(get_caller)]


async def search_caller(request: Request, runtime: RuntimeDep, caller: CallerDep) -> Caller:
    """A caller allowed to search the route's catalogue (``/v1/indexes/{name}/...``, else the default
    index): 401 without a key where CCRK_SEARCH_REQUIRES_KEY, 403 for a key of other catalogues, 429 when
    its bucket is empty (``service.ratelimit``). The ``RateLimit-*`` headers ride on the answer."""
    if caller.anonymous and runtime.settings.search_requires_key:
        raise UnauthorizedError(
            "an API key is required (Authorization: Bearer KEY, or X-API-Key)",
            loc=("header", "authorization"),
        )
    index = request.path_params.get("name") or runtime.settings.index_name
    if caller.record is not None and not caller.record.allows_index(index):
        raise ScopeError(f"this API key is not valid for index {index!r}", loc=("path", "name"))
    runtime.admit(caller, request)
    return caller


SearchCallerDep = Annotated[Caller, Depends(search_caller)]


def _scoped_caller(request: Request, runtime: Runtime, caller: Caller, scope: Scope, needs: str) -> Caller:
    """The caller when it may do ``scope`` on the route's catalogue: the admin key, or an API key of that
    scope (or one granting it) valid for that index. 401 without a key (``needs``: what the key is for),
    403 for another scope or catalogue, 429 when its bucket is empty (the fair share of its searches)."""
    if caller.anonymous:
        raise UnauthorizedError(
            f"{needs} needs an API key of scope {scope} (Authorization: Bearer KEY, or X-API-Key)",
            loc=("header", "authorization"),
        )
    index = request.path_params.get("name") or runtime.settings.index_name
    record = caller.record
    if record is not None and not record.allows_scope(scope):
        raise ScopeError(
            f"this API key has scope {record.scope}, not {scope}", loc=("header", "authorization")
        )
    if record is not None and not record.allows_index(index):
        raise ScopeError(f"this API key is not valid for index {index!r}", loc=("path", "name"))
    runtime.admit(caller, request)
    return caller


async def write_caller(request: Request, runtime: RuntimeDep, caller: CallerDep) -> Caller:
    """A caller allowed to write the products of the route's catalogue (``service.live``): scope write or
    admin (writes never go anonymous)."""
    return _scoped_caller(request, runtime, caller, "write", "writing products")


WriteCallerDep = Annotated[Caller, Depends(write_caller)]


async def events_caller(request: Request, runtime: RuntimeDep, caller: CallerDep) -> Caller:
    """A caller allowed to send the shoppers' events of the route's catalogue (``service.analytics``): scope
    events or admin (a front end sends its events with its key)."""
    return _scoped_caller(request, runtime, caller, "events", "sending events")


EventsCallerDep = Annotated[Caller, Depends(events_caller)]


async def expensive_slot(runtime: RuntimeDep, caller: SearchCallerDep) -> AsyncIterator[Caller]:
    """One of the caller's slots for expensive work (image search), held to the end of the request."""
    async with runtime.expensive(caller):
        yield caller


ExpensiveCallerDep = Annotated[Caller, Depends(expensive_slot)]


async def require_admin(
    request: Request,
    runtime: RuntimeDep,
    authorization: AuthorizationHeader = None,
    x_api_key: ApiKeyHeader = None,
) -> KeyRecord | None:
    """The admin key (CCRK_ADMIN_API_KEY: None, every index) or an API key of scope admin (its record,
    whose indexes the route checks); 404 when neither exists. Wrong keys are throttled per address."""
    admin_key = runtime.settings.admin_api_key
    if not admin_key and not runtime.keys.has_admin_keys:
        raise NotFoundError("admin routes are disabled (CCRK_ADMIN_API_KEY is not set, no admin API key)")
    missing = UnauthorizedError("missing or wrong X-API-Key header", loc=("header", "x-api-key"))
    if authorization is None and x_api_key is None:
        raise missing
    _check_throttle(runtime, request)
    try:
        key = _presented_key(authorization, x_api_key)
    except UnauthorizedError as exc:
        _refuse(runtime, request, exc)
    assert key is not None
    if is_admin_key(key, admin_key):
        return None
    record = runtime.keys.lookup(key)
    if record is None:
        _refuse(runtime, request, missing)
    if not record.allows_scope("admin"):
        raise ScopeError(f"this API key has scope {record.scope}, not admin", loc=("header", "x-api-key"))
    return record


AdminDep = Annotated[KeyRecord | None, Depends(require_admin)]


IndexName = Annotated[
    str,
    PathParam(max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="A served index."),
]


async def administered_index(admin: AdminDep, runtime: RuntimeDep, name: IndexName) -> IndexHolder:
    """The holder of served index ``name`` for an admin route on it (its rules, its synonyms): 403 for an
    API key of scope admin restricted to other indexes, 404 for an index this process does not serve."""
    if admin is not None and not admin.allows_index(name):
        raise ScopeError(f"this API key may not administer index {name!r}", loc=("path", "name"))
    return runtime.catalogue_holder(name)


AdministeredIndexDep = Annotated[IndexHolder, Depends(administered_index)]
