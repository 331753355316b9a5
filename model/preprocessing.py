"""Image preprocessing shared by training, evaluation, the indexer and the service.

Images are resized to the model's square input (the whole product stays visible, as CCLM's resize does; or,
with ``crop_pct``, shorter side resized and centre square taken, as ImageNet classifiers expect),
kept as uint8 until a batch is formed (4x less memory than float), then normalised. The module needs only
numpy and Pillow, so a serving process on ONNX Runtime never imports torch; torch tensors are accepted by
``normalize`` when the caller already has them.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from model.configs import VisionConfig

# JPEG (and MPO, the multi-picture JPEG phones write) decode at a reduced scale no smaller than this multiple
# of the model's input (Pillow's draft: 1/2 to 1/8 in the DCT domain, far less memory and CPU).
DRAFT_OVERSAMPLE = 2
EXIF_ORIENTATION = 0x0112
# Background of transparent pixels: product shots with an alpha channel are cut-outs meant for white pages.
TRANSPARENT_BACKGROUND = (255, 255, 255)


class ImageDecodeError(ValueError):
    """An image file is missing or cannot be decoded."""


def draft_for(image: Image.Image, image_size: int) -> Image.Image:
    """The first frame, and for JPEG/MPO a DCT-domain downscale kept at >= ``DRAFT_OVERSAMPLE`` x the model's
    input (so the bicubic resize still averages; on the shared photos 2.7x faster, embedding cosine >=
    0.9997). Call before the pixels are loaded."""
    image.seek(0)  # first frame of animated GIF/WebP, first picture of an MPO
    if image.format in ("JPEG", "MPO"):
        size = DRAFT_OVERSAMPLE * image_size
        image.draft(None, (size, size))
    return image


# Pixels converted at a time (a strip of whole rows): full-frame float64 copies of a 24 MP 16-bit scan cost
# ~530 MB per decode; strips keep the working memory to a few MB beyond the decoded frame and its 8-bit plane.
STRIP_PIXELS = 1 << 18
GREY16_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
ALPHA_MODES = ("RGBA", "LA", "La", "RGBa", "PA")
# Bytes per pixel of Pillow's frame buffer for a mode (multi-band modes take 4, RGB included).
FRAME_BYTES = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16L": 2, "I;16B": 2, "I;16N": 2}
# EXIF orientation -> the transposition that makes the image upright (as ImageOps.exif_transpose).
ORIENTATION_FIX = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def _strips(image: Image.Image) -> list[tuple[int, int]]:
    width, height = image.size
    rows = max(1, STRIP_PIXELS // max(width, 1))
    return [(top, min(height, top + rows)) for top in range(0, height, rows)]


def _strip(image: Image.Image, top: int, bottom: int) -> Image.Image:
    return image.crop((0, top, image.size[0], bottom))


def _from_planes(image: Image.Image, scaled: Any) -> Image.Image:
    """An 8-bit greyscale frame made strip by strip: ``scaled(strip values) -> uint8 values``."""
    out = np.empty((image.size[1], image.size[0]), dtype=np.uint8)
    for top, bottom in _strips(image):
        out[top:bottom] = scaled(np.asarray(_strip(image, top, bottom)))
    return Image.fromarray(out)


def _strip_max(image: Image.Image, finite: bool = False) -> float:
    """The largest value of a single-band image (finite values only when asked), read strip by strip."""
    most = -np.inf
    for top, bottom in _strips(image):
        values = np.asarray(_strip(image, top, bottom))
        if finite:
            values = values[np.isfinite(values)]
        if values.size:
            most = max(most, float(values.max()))
    return most


def eight_bit(image: Image.Image) -> Image.Image:
    """The image as 8-bit greyscale (``L``, for greyscale modes) or RGB, scaled by its mode's range: 16-bit
    greyscale (I;16*, and I when its values exceed 8 bits) divided by 257, float (F) by its [0, 1] or
    [0, 255] range; transparency composited on white. Pillow's own ``convert("RGB")`` clips I;16 to 255, so
    a 16-bit scan came out white.

    Converted in the image's own bit depth, strip by strip (``STRIP_PIXELS``): the memory is the decoded
    frame, the 8-bit frame and a few MB, never a full-frame float copy. The arithmetic per pixel is the one
    the full-frame conversion did (the same values)."""
    mode = image.mode
    if mode in ("L", "RGB"):
        return image
    if mode in GREY16_MODES:
        scale = mode != "I" or _strip_max(image) > 255

        def grey(values: np.ndarray) -> np.ndarray:
            values = values.astype(np.float64)
            if scale:
                values = values / 257.0
            return np.clip(np.rint(values), 0, 255).astype(np.uint8)

        return _from_planes(image, grey)
    if mode == "F":
        top_value = _strip_max(image, finite=True)
        factor = 255.0 if np.isfinite(top_value) and top_value <= 1.0 else 1.0

        def real(values: np.ndarray) -> np.ndarray:
            values = np.nan_to_num(values.astype(np.float64) * factor, nan=0.0, posinf=255.0, neginf=0.0)
            return np.clip(np.rint(values), 0, 255).astype(np.uint8)

        return _from_planes(image, real)
    out = Image.new("RGB", image.size)
    transparent = mode in ALPHA_MODES or (mode == "P" and "transparency" in image.info)
    for top, bottom in _strips(image):
        strip = _strip(image, top, bottom)
        if transparent:
            rgba = strip.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (*TRANSPARENT_BACKGROUND, 255))
            strip = Image.alpha_composite(background, rgba)
        out.paste(strip.convert("RGB"), (0, top))
    return out


def to_rgb(image: Image.Image) -> Image.Image:
    """8-bit RGB of any mode Pillow opens (``eight_bit``, then greyscale made RGB)."""
    plane = eight_bit(image)
    return plane if plane.mode == "RGB" else plane.convert("RGB")


def upright(image: Image.Image, orientation: int) -> Image.Image:
    """The image turned as its EXIF orientation says (``ImageOps.exif_transpose``'s transposition)."""
    method = ORIENTATION_FIX.get(orientation)
    return image if method is None else image.transpose(method)


def decode_bytes(mode: str, size: tuple[int, int], *, turned: bool = True) -> int:
    """Most memory one image of this mode and size takes to decode and preprocess
    (``ImagePreprocessor.to_uint8``): its decoded frame, its 8-bit frame (kept greyscale when it is; none for
    L and RGB), a turned copy of that when ``turned`` (an EXIF orientation), the strips' working arrays.
    Known from the header, before decoding. Measured (peak RSS of a fresh process decoding 4898 x 4898 PNGs,
    unturned): I;16 +78 MB (this says 82 MB; the full-frame float64 conversion took +596 MB), RGBA +194 MB
    (this: 202 MB; before +459 MB), RGB +101 MB (this: 106 MB)."""
    pixels = size[0] * size[1]
    frame = FRAME_BYTES.get(mode, 4) * pixels
    plane = (1 if mode in (*GREY16_MODES, "F", "L") else 4) * pixels
    converted = 0 if mode in ("L", "RGB") else plane
    frames = frame + converted + (plane if turned else 0)
    return frames + frames // 20 + 40 * STRIP_PIXELS  # resizing's buffers, the strips' arrays


class ImagePreprocessor:
    """Decode, resize and normalise images for one vision config."""

    def __init__(self, cfg: VisionConfig) -> None:
        self.image_size = cfg.image_size
        self.crop_pct = cfg.crop_pct
        self.mean255 = np.asarray(cfg.mean, dtype=np.float32).reshape(1, 3, 1, 1) * 255.0
        self.std255 = np.asarray(cfg.std, dtype=np.float32).reshape(1, 3, 1, 1) * 255.0

    def to_uint8(self, image: Image.Image) -> np.ndarray:
        """(3, S, S) uint8 array of an RGB-converted, EXIF-rotated, resized image."""
        # Converted to 8 bits first (in strips, in the image's own bit depth), then turned upright: a turn
        # of the native frame copied it whole (ImageOps.exif_transpose), at up to 4 bytes a pixel.
        orientation = image.getexif().get(EXIF_ORIENTATION, 1)
        image = upright(eight_bit(image), orientation)
        size = self.image_size
        if self.crop_pct is not None:
            # The centre square of side crop_pct * shorter side, resized in one step: resizing the whole
            # image first would blow a thin strip (10,000 x 4 px) up to gigabytes before the crop.
            width, height = image.size
            side = min(width, height) * self.crop_pct
            left, top = (width - side) / 2.0, (height - side) / 2.0
            image = image.resize(
                (size, size), Image.Resampling.BICUBIC, box=(left, top, left + side, top + side)
            )
        elif image.size != (size, size):
            image = image.resize((size, size), Image.Resampling.BICUBIC)
        if image.mode != "RGB":
            image = image.convert("RGB")  # greyscale resized as one band, made RGB at the model's size
        return np.ascontiguousarray(np.asarray(image, dtype=np.uint8).transpose(2, 0, 1))

    def load_uint8(self, path: Path | str) -> np.ndarray:
        try:
            with Image.open(path) as image:
                image.seek(0)  # first frame; decoded in full (the indexer's decoder drafts JPEGs)
                return self.to_uint8(image)
        except FileNotFoundError as exc:
            raise ImageDecodeError(f"image not found: {path}") from exc
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise ImageDecodeError(f"cannot decode image {path}: {exc}") from exc

    def load_many_uint8(self, paths: Sequence[Path | str], threads: int = 2) -> np.ndarray:
        """(N, 3, S, S) uint8; PIL releases the GIL while decoding, so threads scale on 2 cores."""
        if not paths:
            return np.empty((0, 3, self.image_size, self.image_size), dtype=np.uint8)
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            return np.stack(list(pool.map(self.load_uint8, paths)))

    def normalize(self, images: Any) -> Any:
        """uint8 (N, 3, S, S) -> float32 normalised pixels: a numpy array, or a torch tensor kept on its
        device."""
        if isinstance(images, np.ndarray):
            return (images.astype(np.float32) - self.mean255) / self.std255
        import torch  # only reached with a torch tensor in hand, so torch is already loaded

        mean = torch.from_numpy(self.mean255).to(images.device)
        std = torch.from_numpy(self.std255).to(images.device)
        return (images.float() - mean) / std
