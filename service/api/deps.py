"""FastAPI dependencies as ``Annotated`` aliases (the routes declare what they need by type).

All are ``async def``: they only read attributes, and FastAPI runs a plain ``def`` dependency in the thread
pool, one thread hop per dependency per request."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Header, Request

from ccrk_settings import Settings
from service.errors import NotFoundError, UnauthorizedError
from service.runtime import Runtime
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


async def require_admin(
    settings: SettingsDep,
    x_api_key: Annotated[str | None, Header(description="The admin API key (CCRK_ADMIN_API_KEY).")] = None,
) -> None:
    if not settings.admin_api_key:
        raise NotFoundError("admin routes are disabled (CCRK_ADMIN_API_KEY is not set)")
    if x_api_key is None or not secrets.compare_digest(x_api_key.encode(), settings.admin_api_key.encode()):
        raise UnauthorizedError("missing or wrong X-API-Key header", loc=("header", "x-api-key"))


AdminDep = Annotated[None, Depends(require_admin)]
