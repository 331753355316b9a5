"""``VisionConfig.crop_pct``: the centre square of side crop_pct x the shorter side, resized to image_size
(what ImageNet classifiers are evaluated on: Resize(size / crop_pct) then CenterCrop(size)); without it the
whole image is resized (unchanged behaviour)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

from model.configs import ConfigError, VisionConfig
from model.preprocessing import ImagePreprocessor

REPO = Path(__file__).resolve().parents[2]


def photo_like(width: int, height: int) -> Image.Image:
    """Smooth content with some texture (a pure gradient would hide an off-by-one crop)."""
    x = np.linspace(0, 6 * np.pi, width, dtype=np.float32)[None, :]
    y = np.linspace(0, 4 * np.pi, height, dtype=np.float32)[:, None]
    channels = [127 + 100 * np.sin(x + y), 127 + 100 * np.cos(x * 0.5 - y), 127 + 60 * np.sin(x * y / 10)]
    return Image.fromarray(np.stack(channels, axis=-1).clip(0, 255).astype(np.uint8))


@pytest.mark.parametrize("size", [(400, 300), (300, 500), (256, 256), (640, 480), (100, 60)])
def test_crop_matches_torchvision_resize_then_centre_crop(size: tuple[int, int]) -> None:
    image = photo_like(*size)
    out = ImagePreprocessor(VisionConfig(image_size=224, crop_pct=0.875)).to_uint8(image)
    reference = transforms.Compose(
        [
            transforms.Resize(256, interpolation=transforms.InterpolationMode.BICUBIC),
            transforms.CenterCrop(224),
            transforms.PILToTensor(),
        ]
    )(image)
    assert out.shape == (3, 224, 224)
    diff = np.abs(out.astype(np.int16) - reference.numpy().astype(np.int16))
    # One resampling step instead of two, and the crop at a sub-pixel offset instead of a rounded one.
    assert diff.mean() < 1.5, diff.mean()
    # Off by even one pixel of the 256 px frame the texture would differ by far more.
    shifted = torch.roll(reference, shifts=2, dims=2).numpy().astype(np.int16)
    assert np.abs(out.astype(np.int16) - shifted).mean() > 2 * diff.mean()


THIN_STRIP = """
import resource
from PIL import Image
from model.configs import VisionConfig
from model.preprocessing import ImagePreprocessor
pre = ImagePreprocessor(VisionConfig(image_size=224, crop_pct=0.875))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = pre.to_uint8(Image.new("RGB", (20_000, 4), (200, 10, 10)))
assert out.shape == (3, 224, 224)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_a_thin_strip_costs_no_large_intermediate() -> None:
    """Pillow's buffers are outside Python's allocator: measured as the peak RSS of a fresh process (resizing
    the whole 20,000 x 4 strip to a 256 px shorter side first would take ~1 GB)."""
    out = subprocess.run(
        [sys.executable, "-c", THIN_STRIP], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert int(out.stdout.strip()) < 50, f"peak grew by {out.stdout.strip()} MB"


def test_without_crop_the_whole_image_is_resized() -> None:
    image = photo_like(400, 300)
    out = ImagePreprocessor(VisionConfig(image_size=64)).to_uint8(image)
    ref = np.asarray(image.resize((64, 64), Image.Resampling.BICUBIC)).transpose(2, 0, 1)
    np.testing.assert_array_equal(out, ref)


def test_crop_pct_is_checked() -> None:
    with pytest.raises(ConfigError, match="crop_pct"):
        VisionConfig(crop_pct=1.5)
