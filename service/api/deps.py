"""FastAPI dependencies as ``Annotated`` aliases (the routes declare what they need by type).

All are ``async def``: they only read attributes, and FastAPI runs a plain ``def`` dependency in the thread
pool, one thread hop per dependency per request."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Header, Request

from ccrk_settings import Settings
from service.errors import NotFoundError, UnauthorizedError
from service.index_holder import Served
from service.runtime import Runtime
from service.searching import Searcher


async def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_settings_dep(runtime: RuntimeDep) -> Settings:
    return runtime.settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


async def get_searcher(runtime: RuntimeDep) -> Searcher:
    return runtime.searcher


SearcherDep = Annotated[Searcher, Depends(get_searcher)]


async def lease_index(runtime: RuntimeDep) -> AsyncIterator[Served]:
    """The served index version, held for the whole request (a swap meanwhile does not close it)."""
    with runtime.holder.lease() as served:
        yield served


ServedDep = Annotated[Served, Depends(lease_index)]


async def require_admin(
    settings: SettingsDep,
    x_api_key: Annotated[str | None, Header(description="The admin API key (CCRK_ADMIN_API_KEY).")] = None,
) -> None:
    if not settings.admin_api_key:
        raise NotFoundError("admin routes are disabled (CCRK_ADMIN_API_KEY is not set)")
    if x_api_key is None or not secrets.compare_digest(x_api_key.encode(), settings.admin_api_key.encode()):
        raise UnauthorizedError("missing or wrong X-API-Key header", loc=("header", "x-api-key"))


AdminDep = Annotated[None, Depends(require_admin)]
