"""Every kind of bad file gets its own reason; good files of every supported format decode to the model's
input size, in worker processes as in this one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFilter

from ccrk_settings import DEFAULT_MODEL_DIR
from indexer.decode import DecodePool, Decoder
from model.configs import CCRkConfig
from model.preprocessing import ImagePreprocessor
from tests.indexer.files import make_bad_files


@pytest.fixture(scope="module")
def vision() -> object:
    return CCRkConfig.load(DEFAULT_MODEL_DIR / "config.json").vision


def test_each_bad_kind_has_its_reason(tmp_path: Path, vision: object) -> None:
    decoder = Decoder(vision, max_pixels=1_000_000)
    for kind, path in make_bad_files(tmp_path).items():
        pixels, got, detail = decoder(str(path))
        assert pixels is None and got == kind, (path.name, got, detail)
        assert detail
    # The same bomb is fine under Pillow's default limit: the limit, not the file, decides.
    pixels, kind, _ = Decoder(vision, max_pixels=89_478_485)(str(tmp_path / "bomb.png"))
    assert kind is None and pixels is not None


def test_good_formats_match_the_model_preprocessor(photo_folder: Path, vision: object) -> None:
    decoder = Decoder(vision, max_pixels=10_000_000)
    pre = ImagePreprocessor(vision)
    paths = sorted(p for p in photo_folder.rglob("*") if p.suffix != ".txt" and p.is_file())
    with DecodePool(decoder, workers=2) as pool:
        results = list(pool.map([str(p) for p in paths]))
    assert len(results) == len(paths) == 12
    for path, (pixels, kind, _) in zip(paths, results, strict=True):
        assert kind is None and pixels.shape == (3, 64, 64) and pixels.dtype == np.uint8
        np.testing.assert_array_equal(pixels, pre.load_uint8(path))  # GIF: first frame


def test_large_jpeg_decodes_at_reduced_scale_close_to_full(tmp_path: Path, vision: object) -> None:
    # A smooth photo-like image (noise would make any two resamplings differ wildly).
    big = Image.fromarray(np.random.default_rng(0).integers(0, 255, (60, 80, 3), dtype=np.uint8))
    path = tmp_path / "big.jpg"
    big.resize((1600, 1200), Image.Resampling.BICUBIC).filter(ImageFilter.GaussianBlur(4)).save(
        path, quality=92
    )
    pixels, kind, _ = Decoder(vision, max_pixels=10_000_000)(str(path))
    full = ImagePreprocessor(vision).load_uint8(path)
    assert kind is None and pixels.shape == full.shape
    assert not np.array_equal(pixels, full)  # really decoded at a reduced scale
    assert np.abs(pixels.astype(int) - full.astype(int)).mean() < 2.0
