"""The photos of products written through the API: their bytes, kept by content beside the index's versions.

A write route stores each uploaded photo here before it appends the change that names it (a record holds
a ``PhotoRef``: the bytes' digest and their location, never the bytes), so a change in the log never names
a photo that is not on disk. Layout, under the index's folder::

    live-photos/ab/abcdef....jpg     the bytes, named by their blake2b-128 (``store.version.reuse``'s
                                     image digest), the extension of their format

Files are written whole (temporary file, fsync, rename, fsync of the folder) and never changed: one name
is one content, so two writers of the same photo write the same file, and a reader checks the digest of
what it reads. Every process serving the index on this machine, or on others sharing its volume, reads
them by their location, relative to the index's folder.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from store.errors import InvalidChangeError, PhotoUnreadableError
from store.layout import index_dir
from store.live.records import PhotoRef
from store.version.reuse import DIGEST_BYTES

PHOTOS_DIR = "live-photos"
EXTENSIONS = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png", "WEBP": "webp"}


def photo_digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).hexdigest()


class PhotoStore:
    """Index ``name``'s stored photos under ``root``."""

    def __init__(self, root: Path, name: str) -> None:
        self.base = index_dir(root, name)

    def put(self, data: bytes, image_format: str) -> PhotoRef:
        """Keep ``data`` (a photo of ``image_format``, PIL's name) durably; its reference."""
        ext = EXTENSIONS.get(image_format)
        if ext is None:
            raise InvalidChangeError(f"photo format {image_format!r} is not kept", field="photos")
        digest = photo_digest(data)
        location = f"{PHOTOS_DIR}/{digest[:2]}/{digest}.{ext}"
        path = self.base / location
        if path.is_file() and path.stat().st_size == len(data):
            return PhotoRef(digest, location)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename is durable before the change naming it is written
        finally:
            os.close(folder)
        return PhotoRef(digest, location)

    def path_of(self, ref: PhotoRef) -> Path:
        """Where ``ref``'s bytes lie (a location outside the photo folder is refused: a record is input)."""
        path = (self.base / ref.location).resolve()
        if not path.is_relative_to((self.base / PHOTOS_DIR).resolve()):
            raise PhotoUnreadableError(f"photo location {ref.location!r} is outside {PHOTOS_DIR}/")
        return path

    def read(self, ref: PhotoRef) -> bytes:
        """``ref``'s bytes, checked against its digest."""
        path = self.path_of(ref)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise PhotoUnreadableError(f"photo {ref.location} cannot be read: {exc}") from None
        if photo_digest(data) != ref.digest:
            raise PhotoUnreadableError(f"photo {ref.location} does not hold the bytes of digest {ref.digest}")
        return data
