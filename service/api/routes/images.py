"""Catalogue images and thumbnails."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse

from service.api.deps import RuntimeDep
from service.runtime import Runtime

router = APIRouter(prefix="/v1/images", tags=["images"])
CACHE_CONTROL = {"Cache-Control": "public, max-age=3600"}

ItemId = Annotated[str, PathParam(min_length=1, max_length=512)]
Size = Annotated[int | None, Query(ge=16, le=1024, description="Longest side of a JPEG thumbnail.")]
Photo = Annotated[
    int, Query(ge=0, le=4096, description="A product's photo: 0 its first, 1 the next (search hits' images).")
]


async def _image(item_id: str, runtime: Runtime, size: int | None, photo: int = 0) -> Response:
    if size is None:
        return FileResponse(await runtime.search.image_file(item_id, photo), headers=CACHE_CONTROL)
    data = await runtime.search.thumbnail(item_id, size, photo)
    return Response(data, media_type="image/jpeg", headers=CACHE_CONTROL)


IMAGE_RESPONSES: dict[int | str, dict] = {
    200: {"content": {"image/*": {}}},
    404: {"description": "Unknown id."},
}


@router.get("", response_class=Response, responses=IMAGE_RESPONSES)
async def get_image_by_query(
    item_id: Annotated[str, Query(alias="id", min_length=1, max_length=512)],
    runtime: RuntimeDep,
    size: Size = None,
    photo: Photo = 0,
) -> Response:
    """The same as ``/v1/images/{id}`` for any id: a path segment cannot hold a line break, a query can
    (search results link here for such ids)."""
    return await _image(item_id, runtime, size, photo)


@router.get("/{item_id:path}", response_class=Response, responses=IMAGE_RESPONSES)
async def get_image(item_id: ItemId, runtime: RuntimeDep, size: Size = None, photo: Photo = 0) -> Response:
    """The catalogue image of an item (a product's ``photo``-th), or a JPEG thumbnail of it when ``size`` is
    given."""
    return await _image(item_id, runtime, size, photo)
