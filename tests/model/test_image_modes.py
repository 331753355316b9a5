"""Every image mode Pillow opens becomes correctly scaled 8-bit RGB, through the one decoding path that the
indexer (``indexer.decode.Decoder``, from files) and query uploads (``service.uploads``, then the encoder's
preprocessor) share. Pillow's own convert("RGB") clips 16-bit greyscale to white."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from indexer.decode import Decoder
from model import preprocessing
from model.configs import VisionConfig
from model.preprocessing import ImagePreprocessor, to_rgb
from service.uploads import decode_upload

VISION = VisionConfig(image_size=32)
SIZE = (48, 40)


def grey16(value: int) -> Image.Image:
    """16-bit greyscale as a 16-bit PNG opens (mode I;16)."""
    return Image.frombytes("I;16", SIZE, np.full(SIZE[::-1], value, dtype="<u2").tobytes())


def filled(value: float, dtype: type, mode: str) -> Callable[[], Image.Image]:
    return lambda: Image.fromarray(np.full(SIZE[::-1], value, dtype=dtype), mode)


def transparent_palette() -> Image.Image:
    image = Image.new("P", SIZE, 0)
    image.putpalette([10, 20, 30] + [200, 0, 0] * 255)
    image.paste(1, (0, 0, SIZE[0] // 2, SIZE[1]))  # left half red, right half palette 0 (transparent)
    image.info["transparency"] = 0
    return image


# (mode, image factory, expected RGB of the left-top pixel, expected RGB of the right-bottom pixel)
CASES: list[tuple[str, Callable[[], Image.Image], tuple[int, ...], tuple[int, ...]]] = [
    ("1", lambda: Image.new("1", SIZE, 1), (255, 255, 255), (255, 255, 255)),
    ("L", lambda: Image.new("L", SIZE, 100), (100, 100, 100), (100, 100, 100)),
    ("LA", lambda: Image.new("LA", SIZE, (100, 0)), (255, 255, 255), (255, 255, 255)),  # transparent: white
    ("I;16", lambda: grey16(32896), (128, 128, 128), (128, 128, 128)),
    ("I;16 white", lambda: grey16(65535), (255, 255, 255), (255, 255, 255)),
    ("I 16-bit", filled(32896, np.int32, "I"), (128,) * 3, (128,) * 3),
    ("I 8-bit", filled(100, np.int32, "I"), (100,) * 3, (100,) * 3),
    ("F [0,1]", filled(0.5, np.float32, "F"), (128,) * 3, (128,) * 3),
    ("F [0,255]", filled(100.0, np.float32, "F"), (100,) * 3, (100,) * 3),
    ("P transparency", transparent_palette, (200, 0, 0), (255, 255, 255)),
    ("CMYK", lambda: Image.new("CMYK", SIZE, (0, 255, 255, 0)), (255, 0, 0), (255, 0, 0)),
    ("YCbCr", lambda: Image.new("RGB", SIZE, (0, 0, 255)).convert("YCbCr"), (0, 0, 255), (0, 0, 255)),
    ("RGBA half", lambda: Image.new("RGBA", SIZE, (0, 0, 0, 128)), (127, 127, 127), (127, 127, 127)),
    ("RGB", lambda: Image.new("RGB", SIZE, (1, 2, 3)), (1, 2, 3), (1, 2, 3)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "factory", "left", "right"), CASES, ids=[c[0] for c in CASES])
def test_modes_convert_to_scaled_rgb(
    name: str, factory: Callable[[], Image.Image], left: tuple[int, ...], right: tuple[int, ...]
) -> None:
    rgb = np.asarray(to_rgb(factory()))
    assert rgb.dtype == np.uint8 and rgb.shape == (SIZE[1], SIZE[0], 3)
    np.testing.assert_allclose(rgb[0, 0], left, atol=1)
    np.testing.assert_allclose(rgb[-1, -1], right, atol=1)


SAVEABLE = [("I;16", "PNG"), ("LA", "PNG"), ("P transparency", "PNG"), ("CMYK", "TIFF"), ("F [0,1]", "TIFF")]


@pytest.mark.parametrize(("name", "fmt"), SAVEABLE)
def test_indexer_files_and_preprocessor_agree(name: str, fmt: str, tmp_path: Path) -> None:
    """The indexer reads the file; the preprocessor converts the image in memory: the same pixels."""
    factory = next(c[1] for c in CASES if c[0] == name)
    path = tmp_path / f"image.{fmt.lower()}"
    factory().save(path, format=fmt)
    from_file, kind, detail = Decoder(VISION, 10_000_000)(str(path))
    assert kind is None, detail
    with Image.open(path) as reopened:
        in_memory = ImagePreprocessor(VISION).to_uint8(reopened)
    np.testing.assert_array_equal(from_file, in_memory)
    assert from_file.mean() != 255 or name == "LA"  # 16-bit greyscale is no longer all white


def mpo_bytes() -> bytes:
    buffer = io.BytesIO()
    first, second = Image.new("RGB", (64, 48), (200, 30, 30)), Image.new("RGB", (64, 48), (30, 30, 200))
    first.save(buffer, format="MPO", save_all=True, append_images=[second])
    return buffer.getvalue()


def test_mpo_is_decoded_for_queries_and_indexing(tmp_path: Path) -> None:
    data = mpo_bytes()
    image = decode_upload(data, "image/jpeg", max_bytes=10 << 20, max_pixels=10**6, image_size=32)
    assert image.format == "MPO"
    query = ImagePreprocessor(VISION).to_uint8(image)
    (tmp_path / "phone.jpg").write_bytes(data)
    indexed, kind, _ = Decoder(VISION, 10_000_000)(str(tmp_path / "phone.jpg"))
    assert kind is None
    np.testing.assert_array_equal(query, indexed)
    assert query[0].mean() > 150 and query[2].mean() < 80  # the first picture (red), not the second


def full_frame_rgb(image: Image.Image) -> Image.Image:
    """The reference: the full-frame conversion (float64 copies of the whole frame) the strips replaced."""
    if image.mode in ("I;16", "I"):
        values = np.asarray(image, dtype=np.float64)
        if image.mode != "I" or values.max(initial=0) > 255:
            values = values / 257.0
        return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8)).convert("RGB")
    if image.mode == "F":
        values = np.asarray(image, dtype=np.float64)
        scale = 255.0 if values.max() <= 1.0 else 1.0
        return Image.fromarray(np.clip(np.rint(values * scale), 0, 255).astype(np.uint8)).convert("RGB")
    if image.mode == "RGBA":
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image).convert("RGB")
    return image.convert("RGB")


def random_images() -> dict[str, Image.Image]:
    rng = np.random.default_rng(0)
    shape = (217, 301)
    return {
        "I;16": Image.fromarray(rng.integers(0, 65536, shape, dtype=np.uint16)),
        "I": Image.fromarray(rng.integers(-500, 70_000, shape).astype(np.int32), "I"),
        "F": Image.fromarray(rng.random(shape, dtype=np.float32)),
        "RGBA": Image.fromarray(rng.integers(0, 256, (*shape, 4), dtype=np.uint8), "RGBA"),
        "CMYK": Image.fromarray(rng.integers(0, 256, (*shape, 4), dtype=np.uint8), "CMYK"),
        "L": Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)),
    }


@pytest.mark.parametrize("orientation", [1, 6])
@pytest.mark.parametrize("crop_pct", [None, 0.875])
def test_strips_give_the_full_frame_pixels(
    monkeypatch: pytest.MonkeyPatch, orientation: int, crop_pct: float | None
) -> None:
    """Converted in strips of 1,000 pixels (many strips, a short last one), turned after the 8-bit
    conversion, greyscale resized as one band: the very pixels of the full-frame path."""
    monkeypatch.setattr(preprocessing, "STRIP_PIXELS", 1000)
    preprocessor = ImagePreprocessor(VisionConfig(image_size=64, crop_pct=crop_pct))
    for name, image in random_images().items():
        exif = image.getexif()
        exif[0x0112] = orientation
        image.info["exif"] = exif.tobytes()
        reference = full_frame_rgb(image)
        if orientation != 1:
            reference = reference.transpose(Image.Transpose.ROTATE_270)
        reference.info.pop("exif", None)
        expected = preprocessor.to_uint8(reference)  # RGB, upright: resized as before
        assert np.array_equal(preprocessor.to_uint8(image), expected), name
