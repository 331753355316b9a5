"""Every served index by name (``ccrk serve --index-name a,b,c``): ``/v1/indexes/{name}/search``,
``/search/image``, ``/items/{id}/similar`` and ``/images/{id}``, the same handlers as the default index's
unprefixed routes. An API key restricted to other indexes gets 403 on the searches
(``service.api.deps.search_caller``); images are public, as ``/v1/images`` is (a shop shows them on its
pages), and the hits of an index link to its own image route (``service.index_holder.image_base_of``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from service.api.deps import ExpensiveCallerDep, IndexName, RuntimeDep, SearchCallerDep
from service.api.routes.images import IMAGE_RESPONSES, Photo, Size, image_response
from service.api.routes.images import ItemId as ImageItemId
from service.api.routes.items import JSON_BODY_LIMIT as SIMILAR_BODY_LIMIT
from service.api.routes.items import RESPONSES as SIMILAR_RESPONSES
from service.api.routes.items import ItemId, similar_items
from service.api.routes.search import (
    ERRORS,
    IMAGE_ERRORS,
    JSON_BODY_LIMIT,
    FacetsField,
    FiltersField,
    Offset,
    TopK,
    UploadFileField,
    image_search,
    text_search,
)
from service.schemas import ImageSearchResponse, SearchRequest, SearchResponse, SimilarRequest

router = APIRouter(prefix="/v1/indexes/{name}", tags=["indexes"])

NOT_SERVED = {404: {"description": "The index is not served here (or, for items, an unknown id)."}}


@router.post(
    "/search",
    response_model=SearchResponse,
    responses={**ERRORS, **NOT_SERVED},
    max_body_size=JSON_BODY_LIMIT,
)
async def search(
    name: IndexName, body: SearchRequest, runtime: RuntimeDep, caller: SearchCallerDep, request: Request
) -> Response:
    """Text search of one served index (as ``/v1/search``)."""
    return await text_search(runtime.catalogue(name), runtime, caller, body, request)


@router.post("/search/image", response_model=ImageSearchResponse, responses={**IMAGE_ERRORS, **NOT_SERVED})
async def search_image(
    name: IndexName,
    file: UploadFileField,
    runtime: RuntimeDep,
    caller: ExpensiveCallerDep,
    top_k: TopK = 20,
    offset: Offset = 0,
    filters: FiltersField = None,
    facets: FacetsField = None,
) -> Response:
    """Image search of one served index (as ``/v1/search/image``)."""
    return await image_search(runtime.catalogue(name), runtime, caller, file, top_k, offset, filters, facets)


@router.post(
    "/items/{item_id:path}/similar",
    response_model=ImageSearchResponse,
    responses=SIMILAR_RESPONSES,
    max_body_size=SIMILAR_BODY_LIMIT,
)
async def similar(
    name: IndexName,
    item_id: ItemId,
    runtime: RuntimeDep,
    caller: SearchCallerDep,
    body: SimilarRequest | None = None,
) -> Response:
    """Items like an indexed one, in one served index (as ``/v1/items/{id}/similar``)."""
    return await similar_items(runtime.catalogue(name), runtime, caller, item_id, body)


@router.get("/images", response_class=Response, responses={**IMAGE_RESPONSES, **NOT_SERVED})
async def get_image_by_query(
    name: IndexName,
    item_id: Annotated[str, Query(alias="id", min_length=1)],
    runtime: RuntimeDep,
    size: Size = None,
    photo: Photo = 0,
) -> Response:
    """An item's image in one served index, for any id (as ``/v1/images?id=``)."""
    return await image_response(runtime.catalogue(name), item_id, size, photo)


@router.get("/images/{item_id:path}", response_class=Response, responses={**IMAGE_RESPONSES, **NOT_SERVED})
async def get_image(
    name: IndexName, item_id: ImageItemId, runtime: RuntimeDep, size: Size = None, photo: Photo = 0
) -> Response:
    """An item's image (a product's ``photo``-th) in one served index, or a JPEG thumbnail of it when
    ``size`` is given (as ``/v1/images/{id}``)."""
    return await image_response(runtime.catalogue(name), item_id, size, photo)
