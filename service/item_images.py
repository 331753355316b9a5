"""A catalogue item's image on a served version: its file, or a JPEG thumbnail of it (blocking: file
system, SQLite, Pillow).

The file is opened without following a link (``O_NOFOLLOW``), and only a regular file is served, from the
descriptor that was checked (no second open by path). The indexer checks links when it builds; a file
swapped for a link afterwards (``ln -sf /etc/passwd photos/f1.jpg``) was served. A link found at serve time
is followed only when it stays in its own folder (``latest.jpg -> v3.jpg``); anything else is a 403.
``O_NOFOLLOW`` guards the last component only: a parent folder swapped for a link (``sub -> /etc``) was
followed, so each folder below the photo folder is opened from its parent's descriptor without following
a link (``link_free_root`` says where that walk starts).
(The index records no inode or size per item, so a regular file replaced by another regular file under the
same path is served as it is now.)
"""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO, NamedTuple

from PIL import Image

from model.preprocessing import to_rgb
from service.errors import ForbiddenError, NotFoundError
from service.index_holder import Served

# Modes Pillow reduces without mixing transparent pixels' colours in (I;16 and P it does not reduce).
REDUCIBLE_MODES = frozenset({"L", "RGB", "CMYK", "I", "F"})
OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO does not hang
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class ItemFile(NamedTuple):
    """An item's image file, opened and checked; the caller closes ``file``."""

    file: BinaryIO
    size: int
    mtime: float
    name: str  # the indexed file name (its suffix gives the media type)


def image_path(served: Served, item_id: str, photo: int = 0) -> Path:
    """Where the index says an item's image is (not checked: ``open_item_file`` checks what it opens);
    ``photo`` > 0: a product's further photo (``store.products.channels``)."""
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


def link_free_root(path: Path, item_id: str, version_dir: Path) -> Path:
    """The folder below which no link in ``path`` is followed (links above it are the machine's own:
    ``/home -> /data/home``). A path kept in the version folder: that folder. An image indexed from a
    folder, its id its path there (``sub/inner.jpg``): that folder, so a ``sub`` swapped for a link
    is refused. Otherwise (a manifest naming any path): the image's own folder."""
    if version_dir == path.parent or version_dir in path.parents:
        return version_dir
    parts = PurePosixPath(item_id).parts
    tail = path.parts[-len(parts) :] if parts else ()
    if parts and ".." not in parts and len(parts) < len(path.parts) and tail == parts:
        return Path(*path.parts[: -len(parts)])
    return path.parent


def open_regular_file(path: Path, item_id: str, root: Path | None = None) -> ItemFile:
    """``path`` opened without following a link below ``root`` (default: its own folder), except a last
    component's link that stays in its folder; a 404 when it is gone, a 403 when a link is in the way or
    it is not a regular file."""
    loc = ("path", "item_id")
    root = path.parent if root is None else root
    names = path.relative_to(root).parts
    fd = _open_below(root, names, item_id)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ForbiddenError(f"the image of item {item_id!r} is not a regular file", loc=loc)
        os.set_blocking(fd, True)
        return ItemFile(os.fdopen(fd, "rb"), info.st_size, info.st_mtime, path.name)
    except BaseException:
        os.close(fd)
        raise


def _unreadable(item_id: str, exc: OSError | None = None) -> NotFoundError:
    """A 404 for an image that cannot be opened; one whose file or folder is gone says so."""
    if isinstance(exc, FileNotFoundError):
        return NotFoundError(f"the image of item {item_id!r} is no longer on disk", loc=("path", "item_id"))
    return NotFoundError(f"the image of item {item_id!r} cannot be read", loc=("path", "item_id"))


def _open_below(root: Path, names: tuple[str, ...], item_id: str) -> int:
    """Each folder below ``root`` opened from its parent's descriptor with ``O_NOFOLLOW``: a folder
    swapped for a link after the build cannot lead out (checking ``realpath`` first would leave a window
    between the check and the open)."""
    if os.open not in os.supports_dir_fd:  # no *at() calls here: compare the resolved folder instead
        if os.path.realpath(root.joinpath(*names[:-1])) != os.path.join(os.path.realpath(root), *names[:-1]):
            raise _link_in_path(item_id)
        return _open_last(os.fspath(root.joinpath(*names)), None, root.joinpath(*names), item_id)
    try:
        top = os.open(root, DIR_FLAGS)  # links above the root are followed
    except OSError as exc:
        raise _unreadable(item_id, exc) from None
    folder = _descend(top, names[:-1], item_id)  # closed by it on an error
    try:
        return _open_last(names[-1], folder, root.joinpath(*names), item_id)
    finally:
        os.close(folder)


def _descend(folder: int, names: tuple[str, ...] | list[str], item_id: str) -> int:
    """The descriptor of ``names`` below ``folder`` (which it takes over: closed unless returned)."""
    for name in names:
        try:
            inner = os.open(name, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=folder)
        except OSError as exc:
            try:
                is_link = stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
            except OSError:
                is_link = False
            os.close(folder)
            raise _link_in_path(item_id) if is_link else _unreadable(item_id, exc) from None
        os.close(folder)
        folder = inner
    return folder


def _link_in_path(item_id: str) -> ForbiddenError:
    return ForbiddenError(
        f"a folder on the path of the image of item {item_id!r} is a link; not served",
        loc=("path", "item_id"),
    )


def _open_last(name: str, folder: int | None, path: Path, item_id: str) -> int:
    try:
        return os.open(name, OPEN_FLAGS, dir_fd=folder)
    except FileNotFoundError:
        raise NotFoundError(
            f"the image of item {item_id!r} is no longer on disk", loc=("path", "item_id")
        ) from None
    except OSError as exc:
        if exc.errno != errno.ELOOP:  # ELOOP: the last component is a link
            raise _unreadable(item_id) from None
    # A link staying in its own folder (``latest.jpg -> v3.jpg``) is followed, and nothing further.
    real_folder = os.path.realpath(path.parent)
    target = os.path.realpath(path)
    if not target.startswith(real_folder + os.sep):
        raise ForbiddenError(
            f"the image of item {item_id!r} is a link out of its folder; not served", loc=("path", "item_id")
        )
    inside = Path(target).relative_to(real_folder).parts
    if folder is None:
        return os.open(target, OPEN_FLAGS)
    inner = _descend(os.dup(folder), inside[:-1], item_id)
    try:
        return os.open(inside[-1], OPEN_FLAGS, dir_fd=inner)  # a link now: it changed meanwhile
    except OSError:
        raise _unreadable(item_id) from None
    finally:
        os.close(inner)


def open_item_file(served: Served, item_id: str, photo: int = 0) -> ItemFile:
    path = image_path(served, item_id, photo)
    root = link_free_root(path, item_id if photo == 0 else "", served.index.path)
    return open_regular_file(path, item_id, root)


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
