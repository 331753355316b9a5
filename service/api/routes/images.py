"""Catalogue images and thumbnails."""

from __future__ import annotations

import hashlib
import mimetypes
from email.utils import formatdate
from typing import Annotated

import anyio
from fastapi import APIRouter, Query, Response
from fastapi import Path as PathParam
from starlette.types import Receive, Scope, Send

from service.api.deps import RuntimeDep
from service.item_images import ItemFile
from service.search.facade import SearchFacade

router = APIRouter(prefix="/v1/images", tags=["images"])
CACHE_CONTROL = {"Cache-Control": "public, max-age=3600"}

# No length limit of its own: the indexer takes ids of any length, and a 600-character id was indexed but
# its image link answered 422. The request head limit (CCRK_HTTP_MAX_HEAD_BYTES) bounds the URL.
ItemId = Annotated[str, PathParam(min_length=1)]
Size = Annotated[int | None, Query(ge=16, le=1024, description="Longest side of a JPEG thumbnail.")]
Photo = Annotated[
    int, Query(ge=0, le=4096, description="A product's photo: 0 its first, 1 the next (search hits' images).")
]


CHUNK_BYTES = 64 * 1024


class OpenedFileResponse(Response):
    """A file sent from the descriptor the service opened and checked (``service.item_images``): Starlette's
    FileResponse opens its path again when it sends, and the file behind a path can change meanwhile."""

    def __init__(self, opened: ItemFile, headers: dict[str, str]) -> None:
        media_type = mimetypes.guess_type(opened.name)[0] or "application/octet-stream"
        super().__init__(None, headers=headers, media_type=media_type)
        self.opened = opened
        tag = hashlib.md5(f"{opened.mtime}-{opened.size}".encode(), usedforsecurity=False).hexdigest()
        self.headers["content-length"] = str(opened.size)
        self.headers.setdefault("last-modified", formatdate(opened.mtime, usegmt=True))
        self.headers.setdefault("etag", f'"{tag}"')

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        file = self.opened.file
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            if scope["method"].upper() == "HEAD":
                await send({"type": "http.response.body", "body": b""})
                return
            left = self.opened.size  # as checked: a file growing meanwhile is cut there
            while True:
                chunk = await anyio.to_thread.run_sync(file.read, min(CHUNK_BYTES, left))
                left -= len(chunk)
                more = bool(chunk) and left > 0
                await send({"type": "http.response.body", "body": chunk, "more_body": more})
                if not more:
                    return
        finally:
            file.close()


async def image_response(facade: SearchFacade, item_id: str, size: int | None, photo: int = 0) -> Response:
    """An item's image file, or its JPEG thumbnail when ``size`` is given, from one served index."""
    if size is None:
        return OpenedFileResponse(await facade.image_file(item_id, photo), headers=CACHE_CONTROL)
    data = await facade.thumbnail(item_id, size, photo)
    return Response(data, media_type="image/jpeg", headers=CACHE_CONTROL)


IMAGE_RESPONSES: dict[int | str, dict] = {
    200: {"content": {"image/*": {}}},
    404: {"description": "Unknown id."},
}


@router.get("", response_class=Response, responses=IMAGE_RESPONSES)
async def get_image_by_query(
    item_id: Annotated[str, Query(alias="id", min_length=1)],
    runtime: RuntimeDep,
    size: Size = None,
    photo: Photo = 0,
) -> Response:
    """The same as ``/v1/images/{id}`` for any id: a path segment cannot hold a line break, and ``.`` or
    ``..`` as a segment is removed by clients; a query can (search results link here for such ids)."""
    return await image_response(runtime.search, item_id, size, photo)


@router.get("/{item_id:path}", response_class=Response, responses=IMAGE_RESPONSES)
async def get_image(item_id: ItemId, runtime: RuntimeDep, size: Size = None, photo: Photo = 0) -> Response:
    """The catalogue image of an item (a product's ``photo``-th), or a JPEG thumbnail of it when ``size`` is
    given."""
    return await image_response(runtime.search, item_id, size, photo)
