"""FastAPI dependencies as ``Annotated`` aliases (the routes declare what they need by type).

All are ``async def``: they only read attributes, and FastAPI runs a plain ``def`` dependency in the thread
pool, one thread hop per dependency per request."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi import Path as PathParam
from fastapi.security import APIKeyHeader

from ccrk_settings import Settings
from service.errors import NotFoundError, ScopeError, UnauthorizedError
from service.index_holder import IndexHolder
from service.keys import KeyRecord
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
    key = _presented_key(authorization, x_api_key)
    if key is None:
        host = request.client.host if request.client is not None else "unknown"
        return Caller(identity=f"ip:{host}", record=None)
    admin_key = runtime.settings.admin_api_key
    if admin_key and secrets.compare_digest(key.encode(), admin_key.encode()):
        return Caller(identity="admin", record=None, admin=True)
    record = runtime.keys.lookup(key)
    if record is None:
        where = "authorization" if authorization is not None else "x-api-key"
        raise UnauthorizedError("unknown or revoked API key", loc=("header", where))
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


async def expensive_slot(runtime: RuntimeDep, caller: SearchCallerDep) -> AsyncIterator[Caller]:
    """One of the caller's slots for expensive work (image search), held to the end of the request."""
    async with runtime.expensive(caller):
        yield caller


ExpensiveCallerDep = Annotated[Caller, Depends(expensive_slot)]


async def require_admin(
    runtime: RuntimeDep, authorization: AuthorizationHeader = None, x_api_key: ApiKeyHeader = None
) -> KeyRecord | None:
    """The admin key (CCRK_ADMIN_API_KEY: None, every index) or an API key of scope admin (its record,
    whose indexes the route checks); 404 when neither exists."""
    admin_key = runtime.settings.admin_api_key
    if not admin_key and not runtime.keys.has_admin_keys:
        raise NotFoundError("admin routes are disabled (CCRK_ADMIN_API_KEY is not set, no admin API key)")
    key = _presented_key(authorization, x_api_key)
    if key is not None and admin_key and secrets.compare_digest(key.encode(), admin_key.encode()):
        return None
    record = runtime.keys.lookup(key) if key is not None else None
    if record is None:
        raise UnauthorizedError("missing or wrong X-API-Key header", loc=("header", "x-api-key"))
    if not record.allows_scope("admin"):
        raise ScopeError("this API key has scope search, not admin", loc=("header", "x-api-key"))
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
