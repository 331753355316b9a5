"""``ccrk data synth`` through the ``ccrk`` command: what it wrote, said in words."""

from pathlib import Path

from typer.testing import CliRunner

from ccrk_cli.main import app


def test_synth_prints_a_readable_summary(tmp_path: Path) -> None:
    """It printed the summary dataclass's repr (``CatalogueSummary(out_dir=PosixPath(...), ...)``)."""
    out = tmp_path / "data"
    args = ["data", "synth", "--out", str(out), "--n-train", "6", "--n-val", "2", "--n-test", "4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "CatalogueSummary" not in result.output and "PosixPath" not in result.output
    assert f"catalogue written to {out} in " in result.output
    assert "6 train, 2 val, 4 test images" in result.output
    assert "train.jsonl, val.jsonl, test.jsonl" in result.output and "catalogue.json" in result.output
