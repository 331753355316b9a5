"""Real test files for the indexer tests: photos of every format, one bad file of each kind, model copies."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from ccrk_settings import DEFAULT_MODEL_DIR


def write_photo(path: Path, seed: int, size: tuple[int, int] = (120, 90), fmt: str | None = None) -> Path:
    """A noisy colour image (real pixels, so JPEG/WebP really compress something)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, 3)
    pixels = np.clip(base + rng.normal(0, 40, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format=fmt)
    return path


def make_bad_files(folder: Path) -> dict[str, Path]:
    """One file of each bad kind; the bomb is a real 2000x1000 PNG (bad with a 1 MP pixel limit)."""
    folder.mkdir(parents=True, exist_ok=True)
    good_jpg = write_photo(folder / ".src.jpg", 1, (300, 200))
    good_png = write_photo(folder / ".src.png", 2, (300, 200))
    jpg, png = good_jpg.read_bytes(), good_png.read_bytes()
    files = {
        "missing": folder / "missing.jpg",
        "zero-byte": folder / "zero.jpg",
        "not-an-image": folder / "text.png",
        "truncated": folder / "truncated.jpg",
        "undecodable": folder / "garbage.png",
        "decompression-bomb": folder / "bomb.png",
    }
    files["zero-byte"].write_bytes(b"")
    files["not-an-image"].write_text("id,price\nthis is a CSV, not a PNG\n")
    files["truncated"].write_bytes(jpg[: len(jpg) // 2])
    # A valid PNG signature and header followed by noise: recognised, then fails to decode.
    files["undecodable"].write_bytes(
        png[:60] + bytes(np.random.default_rng(0).integers(0, 255, 4000, dtype=np.uint8))
    )
    Image.new("L", (2000, 1000)).save(files["decompression-bomb"])
    return files


def copy_model(tmp_path: Path, name: str) -> Path:
    """The demo model under another folder name with another config (so another fingerprint)."""
    target = tmp_path / name
    shutil.copytree(DEFAULT_MODEL_DIR, target)
    config = target / "config.json"
    config.write_text(config.read_text().replace('"name": "demo"', f'"name": "{name}"'))
    return target
