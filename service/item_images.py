"""A catalogue item's image on a served version: its file, or a JPEG thumbnail of it (blocking: file
system, SQLite, Pillow)."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

from service.errors import NotFoundError
from service.index_holder import Served


def image_path(served: Served, item_id: str, photo: int = 0) -> Path:
    """The file of an item's image; ``photo`` > 0: a product's further photo (``store.products``)."""
    row = served.index.row_of(item_id)
    if row is None:
        raise NotFoundError(f"no item {item_id!r} in index version {served.version}", loc=("path", "item_id"))
    stored = served.index.items([row])[0].get("path")
    if photo > 0:
        products = getattr(served.index, "products", None)
        photos = products.photo_paths([row]).get(row, []) if products is not None else []
        if photo >= len(photos):
            raise NotFoundError(f"item {item_id!r} has no photo {photo}", loc=("query", "photo"))
        stored = photos[photo]
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


def item_thumbnail(served: Served, item_id: str, size: int, photo: int = 0) -> bytes:
    """A JPEG thumbnail of an item's image, its longest side ``size``; 404 when the file cannot be read."""
    path = image_path(served, item_id, photo)
    try:
        return thumbnail(path, size)
    except OSError as exc:
        raise NotFoundError(
            f"the image of item {item_id!r} cannot be read: {exc}", loc=("path", "item_id")
        ) from None
