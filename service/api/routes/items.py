"""Catalogue items: "more like this"."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Response
from fastapi import Path as PathParam

from service.api.deps import RuntimeDep
from service.schemas import ImageSearchResponse, SimilarRequest

router = APIRouter(prefix="/v1/items", tags=["items"])

JSON_BODY_LIMIT = 64 * 1024
ItemId = Annotated[str, PathParam(min_length=1, max_length=512)]


@router.post(
    "/{item_id:path}/similar",
    response_model=ImageSearchResponse,
    responses={
        404: {"description": "Unknown id."},
        422: {"description": "Invalid input; the error names the field."},
        503: {"description": "No index loaded."},
    },
    max_body_size=JSON_BODY_LIMIT,
)
async def similar(item_id: ItemId, runtime: RuntimeDep, body: SimilarRequest | None = None) -> Response:
    """Items that look like an indexed one, by its stored vectors (no upload): for products, ranked by their
    best photo's visual embedding against the item's first photo."""
    result = await runtime.search.similar(item_id, body or SimilarRequest())
    return Response(result.model_dump_json(), media_type="application/json")
