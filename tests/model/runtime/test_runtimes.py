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


def test_fusion_threads_split_the_batch_and_do_not_spin(model_dir: Path) -> None:
    one = load_encoder(model_dir, "onnx", device="cpu", threads=1)
    split = load_encoder(model_dir, "onnx", device="cpu", threads=1, fusion_threads=2)
    fusion = split._fusion.get_session_options()  # type: ignore[attr-defined]
    assert fusion.intra_op_num_threads == 2
    assert fusion.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert split._text.get_session_options().intra_op_num_threads == 1  # type: ignore[attr-defined]
    query = one.encode_text(["drei rote Tassen"]).row(0)
    tokens = np.repeat(one.encode_images(images()).tokens, 40, axis=0)  # 120 pairs, as a re-rank sends
    assert np.abs(one.score_pairs(query, tokens) - split.score_pairs(query, tokens)).max() < 1e-5


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


def test_int8_serves_only_within_its_measured_cost(model_dir: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from model.export import quantize_int8
    from model.runtime import Int8Limits

    model_dir = Path(shutil.copytree(model_dir, tmp_path / "m"))
    quantize_int8(model_dir)
    manifest_path = model_dir / "onnx" / "export.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.pop("int8_cost", None)
    manifest_path.write_text(json.dumps(manifest))
    limits = Int8Limits(max_recall_drop_points=0.5, max_mrv_increase=0.05)
    unmeasured = load_encoder(model_dir, "onnx", device="cpu", threads=1, int8=True, int8_limits=limits)
    assert unmeasured.int8 is False and "never measured" in unmeasured.int8_refusal
    # Without limits the caller asked for int8 unconditionally (e.g. `ccrk eval --int8`).
    assert load_encoder(model_dir, "onnx", device="cpu", threads=1, int8=True).int8 is True
    cases = ((0.3, 0.01, True, None), (0.8, 0.01, False, "0.80 points"), (0.1, 0.2, False, "MRV by 0.200"))
    for drop, mrv_up, used, reason in cases:
        manifest["int8_cost"] = {"max_mean_recall_drop_points": drop, "max_mrv_increase": mrv_up}
        manifest_path.write_text(json.dumps(manifest))
        enc = load_encoder(model_dir, "onnx", device="cpu", threads=1, int8=True, int8_limits=limits)
        assert enc.int8 is used
        assert enc.int8_refusal is None if reason is None else reason in enc.int8_refusal


def test_int8_cost_is_the_difference_of_two_evaluations(model_dir: Path, tmp_path: Path) -> None:
    import shutil

    from model.evaluation import evaluate_encoder, int8_cost
    from model.export import quantize_int8
    from model.training_data import CaptionedImages

    model_dir = Path(shutil.copytree(model_dir, tmp_path / "m"))
    quantize_int8(model_dir)
    fp32 = load_encoder(model_dir, "onnx", device="cpu", threads=1)
    quant = load_encoder(model_dir, "onnx", device="cpu", threads=1, int8=True)
    size = fp32.config.vision.image_size
    rng = np.random.default_rng(1)
    words = ["red mug", "blue hat", "rote Tasse", "赤いマグカップ", "blue mug", "red hat"]
    data = CaptionedImages(
        ids=[f"i{i}" for i in range(6)],
        pixels=torch.from_numpy(rng.integers(0, 256, (6, 3, size, size), dtype=np.uint8)),
        captions=[{"en": [w], "de": [w + " x"]} for w in words],
        languages=("en", "de"),
        item_keys=[f"i{i}" for i in range(6)],
    )
    same = int8_cost(fp32, fp32, data, rerank_k=2)
    assert same["max_mean_recall_drop_points"] == 0.0 and same["max_mrv_increase"] == 0.0
    cost = int8_cost(fp32, quant, data, rerank_k=2)
    a, b = evaluate_encoder(fp32, data, 2).report(), evaluate_encoder(quant, data, 2).report()
    for variant in ("dual", "reranked"):
        for direction in ("IR", "TR"):
            entry = cost[f"{variant}_{direction}"]
            drop = 100 * (a[variant][direction]["mean_recall"] - b[variant][direction]["mean_recall"])
            assert entry["mean_recall_drop_points"] == pytest.approx(drop)
            assert entry["mrv_increase"] == pytest.approx(
                b[variant][direction]["mrv"] - a[variant][direction]["mrv"]
            )
    assert cost["max_mean_recall_drop_points"] == max(
        cost[f"{v}_{d}"]["mean_recall_drop_points"] for v in ("dual", "reranked") for d in ("IR", "TR")
    )
