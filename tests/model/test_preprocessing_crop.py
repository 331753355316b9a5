"""``VisionConfig.crop_pct``: shorter side to image_size / crop_pct, then the centre square (the ImageNet
classifiers' evaluation transform); without it the whole image is resized (unchanged behaviour)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from model.configs import ConfigError, VisionConfig
from model.preprocessing import ImagePreprocessor


def gradient(width: int, height: int) -> Image.Image:
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None].repeat(width, 1)
    return Image.fromarray(np.stack([x, y, 255 - x], axis=-1).astype(np.uint8))


@pytest.mark.parametrize("size", [(400, 300), (300, 500), (256, 256), (100, 60)])
def test_crop_equals_resize_then_centre_crop(size: tuple[int, int]) -> None:
    image = gradient(*size)
    out = ImagePreprocessor(VisionConfig(image_size=224, crop_pct=0.875)).to_uint8(image)
    w, h = size
    scale = 256 / min(w, h)
    rw, rh = max(224, round(w * scale)), max(224, round(h * scale))
    ref = image.resize((rw, rh), Image.Resampling.BICUBIC) if (rw, rh) != size else image
    left, top = (rw - 224) // 2, (rh - 224) // 2
    ref = np.asarray(ref.crop((left, top, left + 224, top + 224))).transpose(2, 0, 1)
    assert out.shape == (3, 224, 224)
    np.testing.assert_array_equal(out, ref)


def test_without_crop_the_whole_image_is_resized() -> None:
    image = gradient(400, 300)
    out = ImagePreprocessor(VisionConfig(image_size=64)).to_uint8(image)
    ref = np.asarray(image.resize((64, 64), Image.Resampling.BICUBIC)).transpose(2, 0, 1)
    np.testing.assert_array_equal(out, ref)


def test_crop_pct_is_checked() -> None:
    with pytest.raises(ConfigError, match="crop_pct"):
        VisionConfig(crop_pct=1.5)
