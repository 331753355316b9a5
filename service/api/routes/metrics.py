"""Prometheus exposition."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.api.deps import RuntimeDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics(runtime: RuntimeDep) -> Response:
    return Response(runtime.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
