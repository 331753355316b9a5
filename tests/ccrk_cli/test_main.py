"""The ``ccrk`` command end to end on tiny data, and its error messages."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ccrk_cli.main import app
from tests.tiny import tiny_config

runner = CliRunner()


def tiny_config_file(path: Path) -> Path:
    tiny_config(vocab_size=2000, max_length=64, pooling="mean", name="cli-tiny").save(path)
    return path


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "data"
    result = runner.invoke(
        app, ["data", "synth", "--out", str(out), "--n-train", "48", "--n-val", "8", "--n-test", "12"]
    )
    assert result.exit_code == 0, result.output
    return out


def test_synth_writes_the_reference_format(catalogue: Path) -> None:
    lines = (catalogue / "test.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 12
    record = json.loads(lines[0])
    assert set(record["captions"]) == {"en", "de", "fr", "cs", "ja", "zh", "es", "ru", "tr", "id"}
    assert (catalogue / record["image"]).is_file()


def test_train_then_eval(catalogue: Path, tmp_path: Path) -> None:
    config = tiny_config_file(tmp_path / "tiny.json")
    run = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "train",
            "--config",
            str(config),
            "--data",
            str(catalogue),
            "--output",
            str(run),
            "--batch-size",
            "8",
            "--max-steps",
            "2",
            "--epochs",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (run / "model" / "model.safetensors").is_file() and (run / "model" / "tokenizer.json").is_file()
    ranks, report = tmp_path / "ranks.json", tmp_path / "report.json"
    result = runner.invoke(
        app,
        [
            "eval",
            "--model",
            str(run / "model"),
            "--data",
            str(catalogue),
            "--rerank-k",
            "4",
            "--dump-ranks",
            str(ranks),
            "--json-out",
            str(report),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["n_images"] == 12 and "reranked" in data
    dump = json.loads(ranks.read_text())
    assert len(dump["IR"]) == 12 * 2 and len(dump["IR"][0]) == 10 and len(dump["TR"]) == 12
    # The served path: ONNX graphs, fp32 and int8.
    result = runner.invoke(app, ["export", "onnx", "--model", str(run / "model"), "--int8"])
    assert result.exit_code == 0, result.output
    assert (run / "model" / "onnx" / "text_encoder.int8.onnx").is_file()
    result = runner.invoke(
        app,
        [
            "eval",
            "--model",
            str(run / "model"),
            "--data",
            str(catalogue),
            "--backend",
            "onnx",
            "--int8",
            "--json-out",
            str(report),
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["backend"] == "onnx-int8"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["eval", "--model", "/nonexistent/model", "--data", "/nonexistent/test.jsonl"],
            "/nonexistent/test.jsonl",
        ),
        (["train", "--objective", "bogus"], "kcl or one2one"),
        (["train", "--preset", "nope"], "unknown model preset"),
        (["data", "synth", "--out", "/tmp/x", "--n-test", "30000"], "23040"),
    ],
)
def test_bad_input_names_the_problem(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output.replace("\n", "")


def test_eval_names_a_missing_model(catalogue: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["eval", "--model", str(tmp_path / "none"), "--data", str(catalogue)])
    assert result.exit_code == 2
    assert "config.json is missing" in result.output.replace("\n", "")


def test_presets_are_listed() -> None:
    result = runner.invoke(app, ["model", "presets"])
    assert result.exit_code == 0
    assert {"demo", "ccrk-paper", "ccrk-paper-224"} <= set(result.output.split())


def test_convert_official_checkpoint(tmp_path: Path) -> None:
    import torch

    from model.modeling import CCRkModel
    from model.official_checkpoint import to_official_state_dict
    from model.tokenization import train_tokenizer

    config = tiny_config_file(tmp_path / "tiny.json")
    torch.manual_seed(0)
    source = CCRkModel(tiny_config(vocab_size=2000, max_length=64, pooling="mean", name="cli-tiny")).eval()
    torch.save({"model": to_official_state_dict(source)}, tmp_path / "ccrk_tiny.th")
    train_tokenizer(["red mug", "rote Tasse"] * 10, 300, 64).save_pretrained(str(tmp_path / "tok"))
    out = tmp_path / "converted"
    result = runner.invoke(
        app,
        [
            "model",
            "convert-official",
            str(tmp_path / "ccrk_tiny.th"),
            "--out",
            str(out),
            "--tokenizer",
            str(tmp_path / "tok"),
            "--preset",
            str(config),
            "--strict",
        ],
    )
    assert result.exit_code == 0, result.output
    loaded = CCRkModel.from_pretrained(out)
    for name, tensor in source.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    result = runner.invoke(
        app,
        [
            "model",
            "convert-official",
            str(tmp_path / "missing.th"),
            "--out",
            str(out),
            "--tokenizer",
            str(tmp_path / "tok"),
        ],
    )
    assert result.exit_code == 2 and "missing.th" in result.output
