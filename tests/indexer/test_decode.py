"""Every kind of bad file gets its own reason; good files of every supported format decode to the model's
input size, in worker processes as in this one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

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
