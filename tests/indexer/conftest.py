"""Fixtures of the indexer tests: a tiny synthetic catalogue, folders of real image files, settings that
keep everything on one thread, and the shipped demo model through ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from model.runtime import Encoder, load_encoder
from synthetic.synth import SynthConfig, generate_catalogue
from tests.indexer.files import write_photo


@pytest.fixture(scope="session")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 synthetic products with captions in ten languages: DIR/test.jsonl + DIR/images/."""
    out = tmp_path_factory.mktemp("catalogue")
    generate_catalogue(out, SynthConfig(seed=0, n_train=0, n_val=0, n_test=40, image_size=64), workers=1)
    return out


@pytest.fixture(scope="session")
def encoder() -> Encoder:
    return load_encoder(DEFAULT_MODEL_DIR, backend="onnx", threads=1)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        model_dir=DEFAULT_MODEL_DIR,
        backend="onnx",
        device="cpu",
        threads=1,
        index_root=tmp_path / "indexes",
        index_workers=1,
        index_batch_size=8,
        shard_size=8,
        keep_versions=3,
        max_bad_fraction=0.05,
        # No re-rank policy calibration (full re-ranks of caption queries, ~1 s a build here) but where a
        # test asks for it (tests/indexer/test_rerank_policy.py).
        rerank_policy_queries=0,
    )


@pytest.fixture
def photo_folder(tmp_path: Path) -> Path:
    """12 images of every supported kind in nested folders, plus a file that is not an image by suffix."""
    root = tmp_path / "photos"
    for i in range(4):
        write_photo(root / f"p{i}.jpg", i)
    write_photo(root / "sub" / "a.png", 10)
    write_photo(root / "sub" / "b.webp", 11)
    frames = [Image.new("RGB", (40, 30), c) for c in ("red", "blue", "green")]
    frames[0].save(root / "sub" / "anim.gif", save_all=True, append_images=frames[1:])
    for i in range(5):
        write_photo(root / "sub" / "deeper" / f"q{i}.jpeg", 20 + i)
    (root / "notes.txt").write_text("not an image")
    return root
