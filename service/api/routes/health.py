"""Liveness and readiness."""

from __future__ import annotations

import os

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.api.deps import RuntimeDep
from service.schemas import Readiness, Status

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Status)
async def healthz() -> Status:
    """The process answers."""
    return Status(status="ok", pid=os.getpid())


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(runtime: RuntimeDep, request: Request) -> JSONResponse:
    """Ready when the model and a version of the default index are loaded, and no other served index may
    still load (``Runtime.loading``, as Ray Serve's health check): one whose loading gave up (none
    published, a version that cannot be opened) is listed with its reason in ``detail`` but does not hold
    the process back. ``indexes`` lists each one's version where there are several; 503 with the reason
    (server paths left out) while not ready. ``change_logs`` names the indexes whose change log cannot be
    read (``service.live``): still ready, their searches answering from the writes already applied."""
    holder = runtime.holders.get(runtime.settings.index_name)
    served = holder.served if holder is not None else None
    if served is None:
        detail = request.app.state.redact((holder.last_error if holder is not None else None) or "starting")
        return JSONResponse(Readiness(status="unavailable", detail=detail).model_dump(), status_code=503)
    logs = {
        name: request.app.state.redact(feed.problem) for name, feed in runtime.feeds.items() if feed.problem
    } or None
    notices = runtime.notices.problem if runtime.notices is not None else None
    notices = request.app.state.redact(notices) if notices else None
    if len(runtime.index_names) == 1:
        ready = Readiness(
            status="ready", index_version=served.version, change_logs=logs, change_notices=notices
        )
        return JSONResponse(ready.model_dump())
    versions: dict[str, str | None] = {}
    missing = []
    waiting = False
    for name in runtime.index_names:
        held = runtime.holders.get(name)
        version = held.served.version if held is not None and held.served is not None else None
        versions[name] = version
        if version is None:
            why = (held.last_error if held is not None else None) or "starting"
            missing.append(f"{name}: {request.app.state.redact(why)}")
            waiting = waiting or runtime.holds_back(name)
    status = Readiness(status="unavailable" if waiting else "ready", index_version=served.version,
                    indexes=versions, detail="; ".join(missing) or None, change_logs=logs,
                    change_notices=notices)  # fmt: skip
    return JSONResponse(status.model_dump(), status_code=503 if waiting else 200)
