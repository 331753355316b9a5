"""Catalogue images and thumbnails."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Annotated

import anyio
from fastapi import APIRouter, Query, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse
from PIL import Image

from service.api.deps import RuntimeDep, ServedDep
from service.errors import NotFoundError
from service.index_holder import Served
from service.runtime import Runtime

router = APIRouter(prefix="/v1/images", tags=["images"])
CACHE_CONTROL = {"Cache-Control": "public, max-age=3600"}


def image_path(served: Served, item_id: str) -> Path:
    row = served.index.row_of(item_id)
    if row is None:
        raise NotFoundError(f"no item {item_id!r} in index version {served.version}", loc=("path", "item_id"))
    stored = served.index.items([row])[0].get("path")
    if not stored:
        raise NotFoundError(f"item {item_id!r} has no image", loc=("path", "item_id"))
    path = Path(stored)
    if not path.is_absolute():  # relative paths are kept relative to the version folder
        path = served.index.path / path
    if not path.is_file():
        raise NotFoundError(f"the image of item {item_id!r} is no longer on disk", loc=("path", "item_id"))
    return path


def thumbnail(path: Path, size: int) -> bytes:
    with Image.open(path) as image:
        image = image.convert("RGB")
        image.thumbnail((size, size))
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


ItemId = Annotated[str, PathParam(min_length=1, max_length=512)]
Size = Annotated[int | None, Query(ge=16, le=1024, description="Longest side of a JPEG thumbnail.")]


async def _image(item_id: str, served: Served, runtime: Runtime, size: int | None) -> Response:
    path = await anyio.to_thread.run_sync(image_path, served, item_id)
    if size is None:
        return FileResponse(path, headers=CACHE_CONTROL)
    try:
        data = await anyio.to_thread.run_sync(thumbnail, path, size, limiter=runtime.limiter)
    except OSError as exc:
        raise NotFoundError(
            f"the image of item {item_id!r} cannot be read: {exc}", loc=("path", "item_id")
        ) from None
    return Response(data, media_type="image/jpeg", headers=CACHE_CONTROL)


IMAGE_RESPONSES: dict[int | str, dict] = {
    200: {"content": {"image/*": {}}},
    404: {"description": "Unknown id."},
}


@router.get("", response_class=Response, responses=IMAGE_RESPONSES)
async def get_image_by_query(
    item_id: Annotated[str, Query(alias="id", min_length=1, max_length=512)],
    served: ServedDep,
    runtime: RuntimeDep,
    size: Size = None,
) -> Response:
    """The same as ``/v1/images/{id}`` for any id: a path segment cannot hold a line break, a query can
    (search results link here for such ids)."""
    return await _image(item_id, served, runtime, size)


@router.get("/{item_id:path}", response_class=Response, responses=IMAGE_RESPONSES)
async def get_image(item_id: ItemId, served: ServedDep, runtime: RuntimeDep, size: Size = None) -> Response:
    """The catalogue image of an item, or a JPEG thumbnail of it when ``size`` is given."""
    return await _image(item_id, served, runtime, size)
