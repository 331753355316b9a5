"""Catalogue items: "more like this"."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Response
from fastapi import Path as PathParam

from service.api.deps import RuntimeDep, SearchCallerDep
from service.runtime import Caller, Runtime
from service.schemas import ImageSearchResponse, SimilarRequest
from service.search.facade import SearchFacade

router = APIRouter(prefix="/v1/items", tags=["items"])

JSON_BODY_LIMIT = 64 * 1024
ItemId = Annotated[str, PathParam(min_length=1, max_length=512)]
RESPONSES: dict[int | str, dict] = {
    401: {"description": "No API key where CCRK_SEARCH_REQUIRES_KEY, or an unknown or revoked one."},
    403: {"description": "The API key is not valid for this index."},
    404: {"description": "Unknown id."},
    422: {"description": "Invalid input; the error names the field."},
    429: {"description": "Rate limit or daily quota of the caller; see Retry-After."},
    503: {"description": "No index loaded."},
}


async def similar_items(
    facade: SearchFacade, runtime: Runtime, caller: Caller, item_id: str, body: SimilarRequest | None
) -> Response:
    async with runtime.in_line(caller):
        result = await facade.similar(item_id, body or SimilarRequest())
    return Response(result.model_dump_json(), media_type="application/json")


@router.post(
    "/{item_id:path}/similar",
    response_model=ImageSearchResponse,
    responses=RESPONSES,
    max_body_size=JSON_BODY_LIMIT,
)
async def similar(
    item_id: ItemId, runtime: RuntimeDep, caller: SearchCallerDep, body: SimilarRequest | None = None
) -> Response:
    """Items that look like an indexed one, by its stored vectors (no upload): for products, ranked by their
    best photo's visual embedding against the item's first photo."""
    return await similar_items(runtime.search, runtime, caller, item_id, body)
