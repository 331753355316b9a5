"""Administration: the admin key (CCRK_ADMIN_API_KEY) or an API key of scope admin, in ``X-API-Key`` or
``Authorization: Bearer``; off when neither exists."""

from __future__ import annotations

import math
from typing import Annotated

import anyio
from fastapi import APIRouter, Query

from service.api.deps import AdminDep, RuntimeDep
from service.errors import ReloadFailedError, ReloadOutOfMemoryError, ScopeError
from service.schemas import ReloadResponse

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post(
    "/reload",
    response_model=ReloadResponse,
    responses={
        401: {"description": "Missing or wrong API key."},
        404: {"description": "Admin disabled, or the index is not served."},
        403: {"description": "An API key of scope search."},
        409: {
            "description": "The version could not be loaded, or the quality gate refused it (use force); "
            "the old one keeps serving."
        },
        503: {
            "description": "The server ran out of memory opening or loading the version; the old one keeps "
            "serving. The poller tries the version CURRENT names again, never refusing it: at the next poll "
            "(Retry-After: CCRK_INDEX_POLL_S, rounded up), or with another version served after a wait that "
            "doubles from 30 s to 15 min; another version only when asked again."
        },
    },
)
async def reload(
    admin: AdminDep,
    runtime: RuntimeDep,
    version: Annotated[
        str | None, Query(pattern=r"^\d{8}T\d{6}Z-[0-9a-f]{6}$", description="A kept version (rollback).")
    ] = None,
    force: Annotated[bool, Query(description="Serve a version the quality gate refused.")] = False,
    index: Annotated[
        str | None,
        Query(
            max_length=128,
            pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
            description="A served index (`ccrk serve --index-name a,b,c`); default: the default one.",
        ),
    ] = None,
) -> ReloadResponse:
    """Load CURRENT (or ``version``) in the background and swap it in; requests in flight finish on the old
    version. A ``version`` override lasts until CURRENT changes; with several server processes
    (CCRK_WORKERS) only CURRENT can be reloaded (the others pick it up within CCRK_INDEX_POLL_S)."""
    if version is not None and runtime.settings.workers > 1:
        # The call reaches one of the processes: the others would go on serving CURRENT.
        raise ReloadFailedError(
            f"with {runtime.settings.workers} server processes a version override would reach only one of "
            "them; publish the version instead (`ccrk index rollback --to VERSION`)",
            loc=("query", "version"),
        )
    target = index if index is not None else runtime.settings.index_name
    if admin is not None and not admin.allows_index(target):  # an admin key restricted to other indexes
        raise ScopeError(f"this API key may not administer index {target!r}", loc=("query", "index"))
    holder = runtime.holder if index is None else runtime.catalogue_holder(index, loc=("query", "index"))
    previous = holder.served.version if holder.served is not None else None
    try:
        fresh = await anyio.to_thread.run_sync(holder.reload, version, force)
    except ReloadOutOfMemoryError as exc:
        # Memory may be free by then: the poller tries CURRENT's version again within one interval (with
        # another version served, after a wait that doubles; an admin may try again at any time).
        exc.retry_after_s = max(1, math.ceil(runtime.settings.index_poll_s))
        raise
    # Not ``previous`` when nothing was loaded: the background poller may have swapped the same version in
    # while this call waited for the load lock.
    served = holder.served
    current = fresh.version if fresh is not None else (served.version if served is not None else previous)
    assert current is not None
    return ReloadResponse(previous_version=previous, version=current, changed=current != previous)
