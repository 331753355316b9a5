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
from PIL import Image, ImageOps

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


def to_rgb(image: Image.Image) -> Image.Image:
    """8-bit RGB of any mode Pillow opens, scaled by the mode's range: 16-bit greyscale (I;16*, and I when
    its values exceed 8 bits) divided by 257, float (F) by its [0, 1] or [0, 255] range; transparency
    composited on white. Pillow's own ``convert("RGB")`` clips I;16 to 255, so a 16-bit scan came out
    white."""
    mode = image.mode
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        values = np.asarray(image, dtype=np.float64)
        if mode != "I" or values.max(initial=0) > 255:
            values = values / 257.0
        return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8)).convert("RGB")
    if mode == "F":
        values = np.asarray(image, dtype=np.float64)
        finite = values[np.isfinite(values)]
        scale = 255.0 if finite.size and finite.max() <= 1.0 else 1.0
        values = np.nan_to_num(values * scale, nan=0.0, posinf=255.0, neginf=0.0)
        return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8)).convert("RGB")
    if mode in ("RGBA", "LA", "La", "RGBa", "PA") or (mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*TRANSPARENT_BACKGROUND, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image if mode == "RGB" else image.convert("RGB")


class ImagePreprocessor:
    """Decode, resize and normalise images for one vision config."""

    def __init__(self, cfg: VisionConfig) -> None:
        self.image_size = cfg.image_size
        self.crop_pct = cfg.crop_pct
        self.mean255 = np.asarray(cfg.mean, dtype=np.float32).reshape(1, 3, 1, 1) * 255.0
        self.std255 = np.asarray(cfg.std, dtype=np.float32).reshape(1, 3, 1, 1) * 255.0

    def to_uint8(self, image: Image.Image) -> np.ndarray:
        """(3, S, S) uint8 array of an RGB-converted, EXIF-rotated, resized image."""
        if image.getexif().get(EXIF_ORIENTATION, 1) != 1:  # exif_transpose copies even an upright image
            image = ImageOps.exif_transpose(image)
        image = to_rgb(image)
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
