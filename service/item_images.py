"""A catalogue item's image on a served version: its file, or a JPEG thumbnail of it (blocking: file
system, SQLite, Pillow).

The file is opened without following a link (``O_NOFOLLOW``), and only a regular file is served, from the
descriptor that was checked (no second open by path). The indexer checks links when it builds; a file
swapped for a link afterwards (``ln -sf /etc/passwd photos/f1.jpg``) was served. A link found at serve time
is followed only when it stays in its own folder (``latest.jpg -> v3.jpg``); anything else is a 403.
(The index records no inode or size per item, so a regular file replaced by another regular file under the
same path is served as it is now.)
"""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path
from typing import BinaryIO, NamedTuple

from PIL import Image

from model.preprocessing import to_rgb
from service.errors import ForbiddenError, NotFoundError
from service.index_holder import Served

# Modes Pillow reduces without mixing transparent pixels' colours in (I;16 and P it does not reduce).
REDUCIBLE_MODES = frozenset({"L", "RGB", "CMYK", "I", "F"})
OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO does not hang


class ItemFile(NamedTuple):
    """An item's image file, opened and checked; the caller closes ``file``."""

    file: BinaryIO
    size: int
    mtime: float
    name: str  # the indexed file name (its suffix gives the media type)


def image_path(served: Served, item_id: str, photo: int = 0) -> Path:
    """Where the index says an item's image is (not checked: ``open_item_file`` checks what it opens);
    ``photo`` > 0: a product's further photo (``store.products``)."""
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
    return path


def open_regular_file(path: Path, item_id: str) -> ItemFile:
    """``path`` opened without following a link out of its folder; a 404 when it is gone, a 403 when it is
    a link leaving its folder or not a regular file."""
    loc = ("path", "item_id")
    try:
        fd = os.open(path, OPEN_FLAGS)
    except FileNotFoundError:
        raise NotFoundError(f"the image of item {item_id!r} is no longer on disk", loc=loc) from None
    except OSError as exc:
        if exc.errno != errno.ELOOP:  # ELOOP: the last component is a link
            raise NotFoundError(f"the image of item {item_id!r} cannot be read", loc=loc) from None
        fd = _open_link_in_folder(path, item_id)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ForbiddenError(f"the image of item {item_id!r} is not a regular file", loc=loc)
        os.set_blocking(fd, True)
        return ItemFile(os.fdopen(fd, "rb"), info.st_size, info.st_mtime, path.name)
    except BaseException:
        os.close(fd)
        raise


def _open_link_in_folder(path: Path, item_id: str) -> int:
    folder = os.path.realpath(path.parent)
    target = os.path.realpath(path)
    if not target.startswith(folder + os.sep):
        raise ForbiddenError(
            f"the image of item {item_id!r} is a link out of its folder; not served", loc=("path", "item_id")
        )
    try:
        return os.open(target, OPEN_FLAGS)  # resolved: a link now means it changed meanwhile
    except OSError:
        raise NotFoundError(
            f"the image of item {item_id!r} cannot be read", loc=("path", "item_id")
        ) from None


def open_item_file(served: Served, item_id: str, photo: int = 0) -> ItemFile:
    return open_regular_file(image_path(served, item_id, photo), item_id)


def thumbnail(file: BinaryIO, size: int) -> bytes:
    """A JPEG of at most ``size`` px a side; every mode scaled as the encoder sees it (``to_rgb``: a 16-bit
    greyscale scan was white through Pillow's ``convert("RGB")``)."""
    with Image.open(file) as image:
        image.seek(0)
        image.draft("RGB", (size, size))  # JPEG: decoded at a reduced scale
        factor = min(image.size) // (2 * size)
        if factor >= 2 and image.mode in REDUCIBLE_MODES:  # a box average in the native mode first: the
            image = image.reduce(factor)  # 8-bit frame of a large image is not made whole (alpha: it is)
        rgb = to_rgb(image)
        rgb.thumbnail((size, size))
        buffer = io.BytesIO()
        rgb.save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


def item_thumbnail(served: Served, item_id: str, size: int, photo: int = 0) -> bytes:
    """A JPEG thumbnail of an item's image, its longest side ``size``; 404 when the file cannot be read."""
    opened = open_item_file(served, item_id, photo)
    try:
        return thumbnail(opened.file, size)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise NotFoundError(
            f"the image of item {item_id!r} cannot be read: {exc}", loc=("path", "item_id")
        ) from None
    finally:
        opened.file.close()
