"""The model package's command modules: each command group in a module of its own, under the 500 lines the
project holds a module to (``model/cli.py`` had grown to 607 with every group in it)."""

from pathlib import Path

import typer

from ccrk_cli.main import app

MODEL = Path(__file__).resolve().parents[2] / "model"
MAX_LINES = 500


def test_command_modules_stay_under_the_line_limit() -> None:
    sizes = {path.name: len(path.read_text(encoding="utf-8").splitlines()) for path in MODEL.glob("cli*.py")}
    assert {"cli.py", "cli_data.py", "cli_train.py", "cli_experiment.py"} <= set(sizes)
    assert all(n <= MAX_LINES for n in sizes.values()), sizes


def test_every_model_command_is_still_on_ccrk() -> None:
    groups = {group.name: group.typer_instance for group in app.registered_groups}
    commands = {
        name: {c.name for c in groups[name].registered_commands}
        for name in ("data", "model", "export", "experiment")
    }
    assert commands == {
        "data": {"synth", "pairs"},
        "model": {"convert-official", "add-language", "presets", "build-starter"},
        "export": {"onnx", "int8-cost"},
        "experiment": {"kcl-vs-one2one", "add-language-noise"},
    }
    assert {"train", "eval"} <= {c.name for c in app.registered_commands}
    assert isinstance(groups["data"], typer.Typer)
