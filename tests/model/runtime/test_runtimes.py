"""The encoder interface: torch and ONNX Runtime agree, and the ONNX runtime never imports torch."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from model.export import export_onnx
from model.modeling import CCRkModel
from model.runtime import EncoderError, load_encoder
from model.tokenization import train_tokenizer
from tests.tiny import tiny_config

TEXTS = ["red mug", "drei rote Tassen", "赤いマグカップ", "", "😀 " * 50, "x" * 5000]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model")
    torch.manual_seed(0)
    model = CCRkModel(tiny_config(vocab_size=600, pooling="mean")).eval()
    tokenizer = train_tokenizer(["red mug", "blue hat", "rote Tasse", "赤いマグカップ"] * 10, 600, 32)
    model.save_pretrained(path, tokenizer)
    export_onnx(model, path)
    return path


def images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (40 + 8 * i, 48, 3), dtype=np.uint8)) for i in range(3)]


def test_torch_and_onnx_agree(model_dir: Path) -> None:
    torch_enc = load_encoder(model_dir, "torch", device="cpu")
    onnx_enc = load_encoder(model_dir, "onnx", device="cpu")
    assert (torch_enc.backend, onnx_enc.backend) == ("torch", "onnx")
    # The exported temperature is the trained one (re-ranking scores depend on it).
    assert onnx_enc.temperature == pytest.approx(torch_enc.temperature, rel=1e-6) and onnx_enc.temperature > 0
    a, b = torch_enc.encode_text(TEXTS), onnx_enc.encode_text(TEXTS)
    assert np.array_equal(a.mask, b.mask)  # same tokenization through transformers and raw tokenizers
    assert a.embeds.shape == (len(TEXTS), 16) and a.mask.shape[1] <= 32  # the 5,000-char text is truncated
    assert np.abs(a.embeds - b.embeds).max() < 1e-4
    ia, ib = torch_enc.encode_images(images()), onnx_enc.encode_images(images())
    assert np.abs(ia.embeds - ib.embeds).max() < 1e-4 and np.abs(ia.tokens - ib.tokens).max() < 1e-4
    sa = torch_enc.score_pairs(a.row(0), ia.tokens)
    sb = onnx_enc.score_pairs(b.row(0), ib.tokens)
    assert sa.shape == (3,) and np.abs(sa - sb).max() < 1e-4


def test_score_pairs_matches_the_model(model_dir: Path) -> None:
    enc = load_encoder(model_dir, "onnx", device="cpu")
    model = CCRkModel.from_pretrained(model_dir)
    query = enc.encode_text(["drei rote Tassen", "red mug"]).row(1)  # a padded batch, one row taken
    tokens = enc.encode_images(images()).tokens
    with torch.no_grad():
        for i in range(3):
            logits = model.fuse(
                torch.from_numpy(query.states),
                torch.from_numpy(query.mask),
                torch.from_numpy(tokens[i : i + 1]),
            ).itm_logits[0]
            assert enc.score_pairs(query, tokens)[i] == pytest.approx(float(logits[1] - logits[0]), abs=1e-4)


def test_onnx_runtime_never_imports_torch(model_dir: Path) -> None:
    code = (
        "import sys; from model.runtime import load_encoder; "
        f"enc = load_encoder({str(model_dir)!r}, 'onnx', device='cpu'); "
        "q = enc.encode_text(['red mug']); "
        "import numpy as np; im = enc.encode_images(np.zeros((2, 3, 32, 32), dtype=np.uint8)); "
        "enc.score_pairs(q.row(0), im.tokens); "
        "assert 'torch' not in sys.modules, 'torch was imported'; print('ok')"
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_errors_name_the_problem(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(EncoderError, match="unknown encoder backend"):
        load_encoder(model_dir, "tensorflow")
    with pytest.raises(EncoderError, match="no ONNX export"):
        load_encoder(tmp_path, "onnx")
    with pytest.raises(EncoderError, match=r"config\.json is missing"):
        load_encoder(tmp_path, "torch")
