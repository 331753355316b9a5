"""A damaged model directory is refused before any work: ``ccrk index build`` and ``ccrk serve`` exit 2
with a message naming the damaged file, and nothing is created under the index root (real copies of the
demo model, damaged as an operator's mistake or a broken copy would)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ccrk_cli.main import app
from ccrk_settings import DEFAULT_MODEL_DIR
from model.acquisition_format import AcquirerConfig
from model.model_check import ModelDirError, check_model_dir, known_language
from tests.indexer.files import write_photo

runner = CliRunner()


def demo_copy(tmp_path: Path) -> Path:
    """The demo model's files the ONNX runtime reads (not its torch weights)."""
    model = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, model, ignore=shutil.ignore_patterns("model.safetensors"))
    return model


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def edit_config(model: Path, change: Callable[[dict], None]) -> None:
    path = model / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def with_truncated_acquirer(model: Path) -> str:
    """A Korean acquirer (config, tokenizer) whose graph was cut in half."""
    folder = model / "languages" / "ko"
    folder.mkdir(parents=True)
    AcquirerConfig(
        lang="ko", native=("en",), base_model="demo", base_fingerprint="0" * 16, hidden_size=128,
        num_text_layers=2, pooling="cls", vocab_size=4000, max_length=64, bottleneck=8,
        onnx_graph="text_encoder.ko.onnx",
    ).save(folder / "acquirer.json")  # fmt: skip
    shutil.copy(model / "tokenizer.json", folder / "tokenizer.json")
    graph = model / "onnx" / "text_encoder.ko.onnx"
    shutil.copy(model / "onnx" / "text_encoder.onnx", graph)
    truncate(graph)
    return "onnx/text_encoder.ko.onnx"


def cut(file: str) -> Callable[[Path], str]:
    return lambda model: truncate(model / file) or file


def garbage_tokenizer(model: Path) -> str:
    (model / "tokenizer.json").write_text('{"model": 12, "added')
    return "tokenizer.json"


def config_edit(change: Callable[[dict], None]) -> Callable[[Path], str]:
    return lambda model: edit_config(model, change) or "config.json"


# (case, damage: model dir -> the damaged file relative to it, words the message must hold)
DAMAGES: list[tuple[str, Callable[[Path], str], str]] = [
    ("truncated text graph", cut("onnx/text_encoder.onnx"), "is not a loadable ONNX graph"),
    ("truncated image graph", cut("onnx/image_encoder.onnx"), "is not a loadable ONNX graph"),
    ("truncated fusion graph", cut("onnx/fusion_scorer.onnx"), "is not a loadable ONNX graph"),
    ("truncated acquirer graph", with_truncated_acquirer, "is not a loadable ONNX graph"),
    ("garbage tokenizer", garbage_tokenizer, "is not a tokenizer file"),
    ("edited image_size", config_edit(lambda c: c["vision"].update(image_size=96)), "image_size 96"),
    ("edited embed_dim", config_edit(lambda c: c.update(embed_dim=256)), "embed_dim 256"),
    (
        "unknown language",
        config_edit(lambda c: c.update(languages=[*c["languages"], "xx", "klingon"])),
        "unknown language code(s) ['xx', 'klingon']",
    ),
]


def test_the_demo_model_passes_and_language_codes_are_checked(tmp_path: Path) -> None:
    check_model_dir(DEFAULT_MODEL_DIR, int8=True)
    assert [known_language(c) for c in ("en", "pt-BR", "zh-Hant", "ko")] == [True] * 4
    assert [known_language(c) for c in ("xx", "klingon", "und", "x-foo", "", 5)] == [False] * 6


@pytest.mark.parametrize(("case", "damage", "words"), DAMAGES, ids=[d[0] for d in DAMAGES])
def test_a_damaged_model_fails_the_build_with_exit_2_naming_the_file(
    tmp_path: Path, case: str, damage: Callable[[Path], str], words: str
) -> None:
    model = demo_copy(tmp_path)
    damaged = model / damage(model)
    with pytest.raises(ModelDirError) as raised:
        check_model_dir(model)
    assert raised.value.path == damaged and words in str(raised.value), str(raised.value)
    photos = tmp_path / "photos"
    write_photo(photos / "a.jpg", 0)
    root = tmp_path / "indexes"
    root.mkdir()
    result = runner.invoke(app, ["index", "build", "--name", "shop", "--index-root", str(root), "--model",
                                 str(model), "--workers", "0", "--threads", "1", str(photos)])  # fmt: skip
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())  # rich wraps long lines
    assert str(damaged) in message.replace(" ", "") or str(damaged) in message, message
    assert words in message and "Traceback" not in result.output
    assert list(root.iterdir()) == [], "the failed build left something under the index root"


def test_serve_refuses_a_damaged_model_with_exit_2(tmp_path: Path) -> None:
    model = demo_copy(tmp_path)
    truncate(model / "onnx" / "image_encoder.onnx")
    result = runner.invoke(
        app, ["serve", "--model", str(model), "--index-root", str(tmp_path), "--port", "1"]
    )
    assert result.exit_code == 2, result.output
    assert f"{model / 'onnx' / 'image_encoder.onnx'}: is not a loadable ONNX graph" in result.output
