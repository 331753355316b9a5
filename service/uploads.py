"""Query image uploads: checked before decoding, decoded as the indexer decodes (first frame, JPEG draft,
mode-by-mode conversion in the encoder's preprocessor)."""

from __future__ import annotations

import io
from typing import BinaryIO

from PIL import Image, UnidentifiedImageError

from model.preprocessing import EXIF_ORIENTATION, decode_bytes, draft_for
from service.errors import InvalidInputError, PayloadTooLargeError, UnsupportedMediaTypeError

# MPO: the multi-picture JPEG many phones write (served as image/jpeg); its first picture is searched.
IMAGE_FORMATS = {"JPEG": "image/jpeg", "MPO": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp"}


def decode_upload(
    data: bytes,
    content_type: str | None,
    *,
    max_bytes: int,
    max_pixels: int,
    image_size: int,
    loc: tuple[str | int, ...] = ("body", "file"),
) -> Image.Image:
    """The uploaded query image, checked (size, media type, format, pixel count from the header) and decoded
    (JPEG/MPO at a reduced scale); 413 / 415 / 422 errors name the field ``loc`` (the ``file`` upload)."""
    if len(data) > max_bytes:
        raise PayloadTooLargeError(f"image is {len(data)} bytes, the limit is {max_bytes}", loc=loc)
    if not data:
        raise InvalidInputError("the uploaded file is empty", loc=loc)
    declared = (content_type or "").split(";")[0].strip().lower()
    if declared and declared not in (*IMAGE_FORMATS.values(), "application/octet-stream"):
        raise UnsupportedMediaTypeError(
            f"media type {declared!r} is not accepted; send JPEG, PNG or WebP", loc=loc
        )
    try:
        # Pillow warns (it does not raise) between its bomb limit and twice that; the pixel check below
        # refuses such images anyway (warning filters are process-wide: not changed per request).
        image = Image.open(io.BytesIO(data))
        if image.format not in IMAGE_FORMATS:
            raise UnsupportedMediaTypeError(
                f"image format {image.format} is not accepted; send JPEG, PNG or WebP",
                loc=loc,
            )
        # From the header, before any pixel is decoded: a query needs only the model's input size,
        # and a small PNG of 9400 x 9400 pixels cost 6 s of CPU and ~1 GB to decode.
        pixels = image.size[0] * image.size[1]
        if pixels > max_pixels:
            raise PayloadTooLargeError(
                f"image has {pixels:,} pixels ({image.size[0]} x {image.size[1]}); a query image may "
                f"have at most {max_pixels:,}",
                loc=loc,
            )
        draft_for(image, image_size).load()
    except UnidentifiedImageError:
        raise UnsupportedMediaTypeError("the file is not a JPEG, PNG or WebP image", loc=loc) from None
    except Image.DecompressionBombError as exc:
        raise PayloadTooLargeError(f"image has too many pixels: {exc}", loc=loc) from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise InvalidInputError(f"the image cannot be decoded: {exc}", loc=loc) from None
    return image  # converted to RGB (mode by mode, as the indexer does) by the encoder's preprocessor


def decode_cost(file: BinaryIO, *, max_pixels: int, image_size: int) -> int:
    """Bytes an upload's decode holds (``decode_bytes``), from its header: mode, size after the JPEG draft,
    orientation. The file is read from where it is (memory or disk) and left at its start. An upload that is
    not an image it can read, or is over the pixel limit, costs nothing: its decode ends at the header (a
    4xx)."""
    try:
        with Image.open(file) as image:  # a file object of the caller's: not closed here
            if image.format not in IMAGE_FORMATS or image.size[0] * image.size[1] > max_pixels:
                return 0
            draft_for(image, image_size)  # the size the decode will have (JPEG/MPO: reduced)
            # Only EXIF read with the header: Pillow's PNG reader decodes the whole image to look for an
            # eXIf chunk after the pixels (one that is there is not counted: a turned copy under-counted).
            turned = "exif" in image.info and image.getexif().get(EXIF_ORIENTATION, 1) != 1
            return decode_bytes(image.mode, image.size, turned=turned)
    except Exception:  # anything the header parser raises: decode_upload answers it with a 4xx
        return 0
    finally:
        file.seek(0)
