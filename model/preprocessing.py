"""Image preprocessing shared by training, evaluation, the indexer and the service.

Images are resized to the model's square input (the whole product stays visible, as CCLM's resize does),
kept as uint8 until a batch is formed (4x less memory than float), then normalised.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

from model.configs import VisionConfig


class ImageDecodeError(ValueError):
    """An image file is missing or cannot be decoded."""


class ImagePreprocessor:
    """Decode, resize and normalise images for one vision config."""

    def __init__(self, cfg: VisionConfig) -> None:
        self.image_size = cfg.image_size
        self._mean = torch.tensor(cfg.mean, dtype=torch.float32).view(1, 3, 1, 1) * 255.0
        self._std = torch.tensor(cfg.std, dtype=torch.float32).view(1, 3, 1, 1) * 255.0

    def to_uint8(self, image: Image.Image) -> torch.Tensor:
        """(3, S, S) uint8 tensor of an RGB-converted, EXIF-rotated, resized image."""
        image = ImageOps.exif_transpose(image).convert("RGB")
        if image.size != (self.image_size, self.image_size):
            image = image.resize((self.image_size, self.image_size), Image.Resampling.BICUBIC)
        return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)

    def load_uint8(self, path: Path | str) -> torch.Tensor:
        try:
            with Image.open(path) as image:
                image.seek(0)  # first frame of animated GIF/WebP
                return self.to_uint8(image)
        except FileNotFoundError as exc:
            raise ImageDecodeError(f"image not found: {path}") from exc
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise ImageDecodeError(f"cannot decode image {path}: {exc}") from exc

    def load_many_uint8(self, paths: Sequence[Path | str], threads: int = 2) -> torch.Tensor:
        """(N, 3, S, S) uint8; PIL releases the GIL while decoding, so threads scale on 2 cores."""
        if not paths:
            return torch.empty(0, 3, self.image_size, self.image_size, dtype=torch.uint8)
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            return torch.stack(list(pool.map(self.load_uint8, paths)))

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (N, 3, S, S) -> float32 normalised pixels on the same device."""
        images = images.float()
        return (images - self._mean.to(images.device)) / self._std.to(images.device)
