"""The served index version."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import RuntimeDep
from service.schemas import IndexInfo

router = APIRouter(prefix="/v1/index", tags=["index"])


@router.get("", response_model=IndexInfo, responses={503: {"description": "No index loaded."}})
async def index_info(runtime: RuntimeDep) -> IndexInfo:
    # Attributes of the opened version only (no I/O): read under a lease on the event loop.
    with runtime.holder.lease() as served:
        m = served.index.manifest
        return IndexInfo(
            name=m.name,
            version=m.version,
            created_at=m.created_at,
            model_name=m.model_name,
            model_fingerprint=m.model_fingerprint,
            embed_dim=m.embed_dim,
            count=len(served.index),
            index_factory=m.index_factory,
            search_params=m.search_params,
            measured_recall_at_10=m.measured_recall_at_10,
            rerank=m.rerank,
            loaded_at=served.loaded_at,
        )
