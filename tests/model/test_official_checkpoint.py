"""Official CCRk checkpoint layout: mapping, round trip, report categories and bad files."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from timm.models.swin_transformer import checkpoint_filter_fn

from model.configs import CCRkConfig
from model.modeling import CCRkModel, CheckpointError
from model.official_checkpoint import (
    LoadReport,
    load_official_checkpoint,
    map_official_state_dict,
    to_official_state_dict,
)
from tests.tiny import tiny_config as shared_tiny_config

POS_OFFSET = 2  # pad_token_id + 1


def tiny_config() -> CCRkConfig:
    # Two blocks per stage exercise the downsample move between the Swin layouts.
    return shared_tiny_config(width=64, depths=(2, 2), vocab_size=300, name="tiny-official")


def random_model(seed: int = 0) -> CCRkModel:
    torch.manual_seed(seed)
    model = CCRkModel(tiny_config()).eval()
    with torch.no_grad():
        # Perturb everything, so that LayerNorm ones and zero biases cannot pass without being loaded.
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
        # The official head has one MLM bias; keep both of ours equal so the round trip can be exact.
        model.mlm_head.bias.copy_(model.mlm_head.decoder.bias)
    return model


@pytest.fixture(scope="module")
def model_a() -> CCRkModel:
    return random_model()


@pytest.fixture(scope="module")
def inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 300, (2, 12), generator=gen)
    ids[:, 0] = 0
    mask = torch.ones_like(ids)
    ids[1, 8:] = 1  # right padding, as the tokenizer produces
    mask[1, 8:] = 0
    return {"pixels": torch.rand(2, 3, 32, 32, generator=gen), "ids": ids, "mask": mask}


def outputs(model: CCRkModel, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        image = model.encode_image(inputs["pixels"])
        text = model.encode_text(inputs["ids"], inputs["mask"])
        fused = model.fuse(text.last_hidden_state, inputs["mask"], image.image_tokens)
        mlm = model.mlm_logits(fused.last_hidden_state)
    return [image.image_embeds, image.image_tokens, text.text_embeds, fused.itm_logits, mlm]


def assert_same_weights(a: CCRkModel, b: CCRkModel) -> None:
    sd_a, sd_b = a.state_dict(), b.state_dict()
    assert sd_a.keys() == sd_b.keys()
    differing = [k for k in sd_a if not torch.equal(sd_a[k], sd_b[k])]
    assert not differing, differing


def test_round_trip_through_official_layout(
    model_a: CCRkModel, inputs: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    sd = to_official_state_dict(model_a)
    # Really the official layout.
    assert "vision_encoder.layers.0.downsample.reduction.weight" in sd
    assert not any(k.startswith("vision_encoder.layers.1.downsample.") for k in sd)  # last stage has none
    assert "vision_encoder.layers.0.blocks.0.attn.relative_position_index" in sd
    assert "vision_encoder.layers.0.blocks.1.attn_mask" in sd
    assert "text_encoder.bert.encoder.layer.1.crossattention.self.query.weight" in sd
    assert "text_encoder.bert.encoder.layer.0.crossattention.self.query.weight" not in sd
    assert "text_encoder.cls.predictions.bias" in sd
    assert "text_encoder.cls.predictions.transform.LayerNorm.weight" in sd
    assert "itm_head.3.weight" in sd and "temp" in sd
    assert not any(k.startswith(("vision_encoder.backbone.", "mlm_head.")) for k in sd)
    # timm's own converter, fed the Microsoft layout, gives back exactly our backbone.
    vision = {k[len("vision_encoder.") :]: v for k, v in sd.items() if k.startswith("vision_encoder.")}
    backbone_sd = model_a.vision_encoder.backbone.state_dict()
    converted = checkpoint_filter_fn(vision, model_a.vision_encoder.backbone)
    assert converted.keys() == backbone_sd.keys()
    assert all(torch.equal(converted[k], backbone_sd[k]) for k in backbone_sd)
    # BERT numbering: official row p is our row p + pad_token_id + 1.
    ours = model_a.text_encoder.embeddings.position_embeddings.weight
    official = sd["text_encoder.bert.embeddings.position_embeddings.weight"]
    assert torch.equal(official[:10], ours[POS_OFFSET : POS_OFFSET + 10])

    path = tmp_path / "ccrk_tiny_epoch_29.th"
    torch.save({"model": sd, "config": {"embed_dim": 32}, "epoch": 29}, path)
    model_b, report = load_official_checkpoint(path, tiny_config(), strict=True)

    assert isinstance(report, LoadReport)
    assert report.ok and not report.missing and not report.unexpected and not report.shape_mismatch
    assert any("rolled" in note for note in report.notes)
    assert "text_encoder.embeddings.word_embeddings.weight" in report.loaded
    assert not model_b.training
    assert_same_weights(model_a, model_b)
    # The tie survives loading.
    assert model_b.mlm_head.decoder.weight is model_b.text_encoder.embeddings.word_embeddings.weight
    for out_a, out_b in zip(outputs(model_a, inputs), outputs(model_b, inputs), strict=True):
        assert torch.equal(out_a, out_b)


def _lm_head_naming(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    renames = {
        "text_encoder.cls.predictions.transform.dense.": "text_encoder.lm_head.dense.",
        "text_encoder.cls.predictions.transform.LayerNorm.": "text_encoder.lm_head.layer_norm.",
        "text_encoder.cls.predictions.decoder.": "text_encoder.lm_head.decoder.",
        "text_encoder.cls.predictions.bias": "text_encoder.lm_head.bias",
    }
    out = {}
    for key, tensor in sd.items():
        for old, new in renames.items():
            if key.startswith(old):
                key = new + key[len(old) :]
                break
        out[key] = tensor
    return out


@pytest.mark.parametrize("prefix", ["bert.", "roberta.", ""])
def test_raw_state_dict_and_prefix_variants(model_a: CCRkModel, tmp_path: Path, prefix: str) -> None:
    sd = to_official_state_dict(model_a, bert_prefix=prefix)
    if prefix == "roberta.":
        sd = _lm_head_naming(sd)
        assert "text_encoder.lm_head.layer_norm.weight" in sd
    path = tmp_path / "raw.th"
    torch.save(sd, path)  # no {"model": ...} wrapper
    model_b, report = load_official_checkpoint(path, tiny_config(), strict=True)
    assert report.ok, report.summary()
    assert_same_weights(model_a, model_b)


def test_ignored_unexpected_missing_and_shape_mismatch(model_a: CCRkModel, tmp_path: Path) -> None:
    sd = dict(to_official_state_dict(model_a))
    sd["vision_encoder_m.patch_embed.proj.weight"] = torch.zeros(32, 3, 4, 4)
    sd["text_encoder_m.bert.encoder.layer.0.output.dense.weight"] = torch.zeros(64, 128)
    sd["queue"] = torch.zeros(32, 8)
    sd["idx_queue"] = torch.zeros(1, 8)
    sd["bbox_head.0.weight"] = torch.zeros(128, 64)
    sd["text_encoder.bert.pooler.dense.weight"] = torch.zeros(64, 64)
    sd["text_encoder.bert.embeddings.position_ids"] = torch.arange(70)[None]
    sd["vision_encoder.head.weight"] = torch.zeros(1000, 64)
    sd["mystery.weight"] = torch.zeros(3)
    sd["text_encoder.bert.encoder.layer.7.output.dense.weight"] = torch.zeros(64, 128)  # no such layer
    del sd["text_proj.bias"]
    sd["itm_head.0.weight"] = torch.zeros(3, 64)
    path = tmp_path / "extras.th"
    torch.save({"model": sd}, path)

    model_b, report = load_official_checkpoint(path, tiny_config())
    assert set(report.ignored) >= {
        "vision_encoder_m.patch_embed.proj.weight",
        "text_encoder_m.bert.encoder.layer.0.output.dense.weight",
        "queue",
        "idx_queue",
        "bbox_head.0.weight",
        "text_encoder.bert.pooler.dense.weight",
        "text_encoder.bert.embeddings.position_ids",
        "vision_encoder.head.weight",
        "vision_encoder.layers.0.blocks.0.attn.relative_position_index",
    }
    assert sorted(report.unexpected) == [
        "mystery.weight",
        "text_encoder.bert.encoder.layer.7.output.dense.weight",
    ]
    assert report.missing == ["text_proj.bias"]
    assert report.shape_mismatch == [("itm_head.0.weight", (3, 64), (128, 64))]
    assert not report.ok
    summary = report.summary()
    for name in ("mystery.weight", "text_proj.bias", "itm_head.0.weight", "ignored 13"):
        assert name in summary
    # Everything that fits did load.
    assert torch.equal(model_b.text_proj.weight, model_a.text_proj.weight)
    assert torch.equal(model_b.itm_head[3].weight, model_a.itm_head[3].weight)

    with pytest.raises(CheckpointError) as err:
        load_official_checkpoint(path, tiny_config(), strict=True)
    message = str(err.value)
    for name in ("extras.th", "mystery.weight", "text_proj.bias", "itm_head.0.weight"):
        assert name in message


def test_tied_decoder_that_disagrees_takes_the_embeddings(model_a: CCRkModel) -> None:
    sd = dict(to_official_state_dict(model_a))
    sd["text_encoder.cls.predictions.decoder.weight"] = torch.zeros(300, 64)
    fresh = CCRkModel(tiny_config())
    mapped, report = map_official_state_dict(sd, fresh)
    word = model_a.text_encoder.embeddings.word_embeddings.weight
    assert torch.equal(mapped["mlm_head.decoder.weight"], word)
    assert torch.equal(mapped["text_encoder.embeddings.word_embeddings.weight"], word)
    assert any("cls.predictions.decoder.weight" in note for note in report.notes)
    assert report.ok


def test_files_that_are_not_checkpoints(tmp_path: Path, model_a: CCRkModel) -> None:
    text = tmp_path / "notes.th"
    text.write_text("definitely not a checkpoint\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"notes\.th"):
        load_official_checkpoint(text, tiny_config())

    with pytest.raises(CheckpointError, match=r"missing\.th"):
        load_official_checkpoint(tmp_path / "missing.th", tiny_config())

    listing = tmp_path / "list.th"
    torch.save([1, 2, 3], listing)
    with pytest.raises(CheckpointError, match=r"list\.th holds no state dict"):
        load_official_checkpoint(listing, tiny_config())

    # Python objects beside the tensors: refused unless the caller trusts the file.
    pickled = tmp_path / "pickled.th"
    torch.save({"model": to_official_state_dict(model_a), "args": argparse.Namespace(lr=1e-4)}, pickled)
    with pytest.raises(CheckpointError, match="allow_pickle"):
        load_official_checkpoint(pickled, tiny_config())
    _, report = load_official_checkpoint(pickled, tiny_config(), allow_pickle=True)
    assert report.ok


def test_loaded_embeddings_match_bert_position_numbering(model_a: CCRkModel) -> None:
    # The official text stack is BERT code: token i reads position row i, with no padding offset.
    sd = to_official_state_dict(model_a)
    model_b = CCRkModel(tiny_config()).eval()
    mapped, _ = map_official_state_dict(sd, model_b)
    model_b.load_state_dict(mapped, strict=False)
    ids = torch.tensor([[0, 17, 42, 99, 2]])
    prefix = "text_encoder.bert.embeddings."
    summed = (
        sd[f"{prefix}word_embeddings.weight"][ids]
        + sd[f"{prefix}position_embeddings.weight"][torch.arange(ids.shape[1])]
        + sd[f"{prefix}token_type_embeddings.weight"][0]
    )
    expected = torch.nn.functional.layer_norm(
        summed, (64,), sd[f"{prefix}LayerNorm.weight"], sd[f"{prefix}LayerNorm.bias"], eps=1e-5
    )
    with torch.no_grad():
        got = model_b.text_encoder.embeddings(input_ids=ids)
    torch.testing.assert_close(got, expected)


# -- `ccrk model convert-official` ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def official_files(tmp_path_factory: pytest.TempPathFactory, model_a: CCRkModel) -> dict[str, Path]:
    """A tiny config JSON (the preset), a tokenizer folder, a weights-only file and a full training save."""
    import numpy as np

    from model.tokenization import train_tokenizer

    root = tmp_path_factory.mktemp("official")
    tiny_config().save(root / "tiny.json")
    words = ["red mug", "rote Tasse", "blue hat", "blauer Hut", "green ball", "grüner Ball"]
    train_tokenizer(words * 10, 300, 32).save_pretrained(str(root / "tok"))
    official = to_official_state_dict(model_a)
    torch.save({"model": official}, root / "weights.th")
    # What the official training script saves: optimizer state and numpy's random state beside the model.
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))])
    torch.save(
        {
            "model": official,
            "optimizer": optimizer.state_dict(),
            "np_random_state": np.random.RandomState(0).get_state(),
            "epoch": 29,
        },
        root / "full.th",
    )
    return {
        "config": root / "tiny.json",
        "tok": root / "tok",
        "weights": root / "weights.th",
        "full": root / "full.th",
    }


def convert(files: dict[str, Path], checkpoint: str, out: Path, *extra: str):
    from typer.testing import CliRunner

    from ccrk_cli.main import app

    args = ["model", "convert-official", str(files[checkpoint]), "--out", str(out)]
    args += ["--tokenizer", str(files["tok"]), "--preset", str(files["config"]), *extra]
    return CliRunner().invoke(app, args)


def test_convert_official_defaults_to_the_release_preset() -> None:
    import inspect

    from model.cli import convert_official

    assert inspect.signature(convert_official).parameters["preset"].default == "ccrk-paper-224"


def test_convert_official_full_training_save_needs_allow_pickle(
    official_files: dict[str, Path], model_a: CCRkModel, tmp_path: Path
) -> None:
    refused = convert(official_files, "full", tmp_path / "refused")
    assert refused.exit_code == 2
    assert "--allow-pickle" in refused.output.replace("\n", "")
    assert not (tmp_path / "refused").exists()

    result = convert(official_files, "full", tmp_path / "full", "--allow-pickle", "--strict")
    assert result.exit_code == 0, result.output
    assert "runs code" in result.output.replace("\n", "")  # the warning
    assert_same_weights(model_a, CCRkModel.from_pretrained(tmp_path / "full"))


def test_convert_official_max_length(official_files: dict[str, Path], tmp_path: Path) -> None:
    from model.modeling import read_config

    result = convert(official_files, "weights", tmp_path / "m40", "--max-length", "38")
    assert result.exit_code == 0, result.output
    assert read_config(tmp_path / "m40").text.max_length == 38
    # 39 + pad_token_id + 1 = 41 positions, one more than the tiny table has.
    too_long = convert(official_files, "weights", tmp_path / "m39", "--max-length", "39")
    assert too_long.exit_code == 2 and "max_position_embeddings" in too_long.output.replace("\n", "")


def test_converted_model_exports_and_serves_on_onnx(
    official_files: dict[str, Path], model_a: CCRkModel, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from ccrk_cli.main import app
    from model.runtime import load_encoder

    out = tmp_path / "converted"
    assert convert(official_files, "weights", out, "--strict").exit_code == 0
    result = CliRunner().invoke(app, ["export", "onnx", "--model", str(out)])
    assert result.exit_code == 0, result.output
    onnx, torch_encoder = load_encoder(out, backend="onnx"), load_encoder(out, backend="torch", device="cpu")
    texts = ["red mug", "ein blauer Hut"]
    gen = torch.Generator().manual_seed(5)
    pixels = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8, generator=gen).numpy()
    got_text, want_text = onnx.encode_text(texts), torch_encoder.encode_text(texts)
    got_images, want_images = onnx.encode_images(pixels), torch_encoder.encode_images(pixels)
    assert got_text.embeds.shape == (2, 32) and got_images.embeds.shape == (2, 32)
    assert abs(got_text.embeds - want_text.embeds).max() <= 1e-4
    assert abs(got_images.embeds - want_images.embeds).max() <= 1e-4
    assert abs(got_images.tokens - want_images.tokens).max() <= 1e-4
    # The torch encoder is the checkpoint's model itself.
    with torch.no_grad():
        reference = model_a.encode_image(torch.from_numpy(onnx.preprocessor.normalize(pixels))).image_embeds
    assert abs(want_images.embeds - reference.numpy()).max() <= 1e-6


def test_eval_with_the_paper_ranking(official_files: dict[str, Path], tmp_path: Path) -> None:
    """Reproducing published numbers: convert, then evaluate with the paper's re-rank score."""
    import json

    from typer.testing import CliRunner

    from ccrk_cli.main import app
    from synthetic.synth import SynthConfig, generate_catalogue

    generate_catalogue(tmp_path / "data", SynthConfig(seed=0, n_train=0, n_val=0, n_test=6), workers=1)
    model_dir = tmp_path / "converted"
    assert convert(official_files, "weights", model_dir, "--max-length", "20").exit_code == 0
    base = ["eval", "--model", str(model_dir), "--data", str(tmp_path / "data"), "--rerank-k", "3"]
    runner = CliRunner()
    result = runner.invoke(
        app, [*base, "--rerank-score", "itm_logit", "--json-out", str(tmp_path / "r.json")]
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert report["rerank_score"] == "itm_logit" and "reranked" in report and report["n_images"] == 6
    assert "re-ranked top 3 by itm_logit" in result.output

    # The exported graphs (as served) rank the same by the paper's score.
    assert runner.invoke(app, ["export", "onnx", "--model", str(model_dir)]).exit_code == 0
    onnx = runner.invoke(
        app,
        [*base, "--rerank-score", "itm_logit", "--backend", "onnx", "--json-out", str(tmp_path / "o.json")],
    )
    assert onnx.exit_code == 0, onnx.output
    served = json.loads((tmp_path / "o.json").read_text(encoding="utf-8"))
    assert served["rerank_score"] == "itm_logit"
    # Near-ties of this random model's scores may order differently in fp32 ONNX vs torch; exact rank
    # equality is tested on a tiny model in tests/model/test_reranking.py.
    for direction in ("IR", "TR"):
        ours, theirs = served["reranked"][direction], report["reranked"][direction]
        assert abs(ours["mean_recall"] - theirs["mean_recall"]) < 0.05, direction
    unknown = runner.invoke(app, [*base, "--rerank-score", "itm"])
    assert unknown.exit_code == 2 and "dual_plus_margin, itm_logit" in unknown.output.replace("\n", "")
