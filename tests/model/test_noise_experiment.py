"""``ccrk experiment add-language-noise`` (issue 28) on a tiny model: every grid cell is run and summarised
(mean and sample sd over seeds), the native columns are the frozen model's in every run, the noise is the
share asked, and the command writes the JSON and the table."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from model.language_training import LanguageTrainConfig
from model.modeling import CCRkModel
from model.noise_experiment import add_language_noise, format_noise_table
from model.tokenization import train_tokenizer
from synthetic.catalogue import load_split
from synthetic.lexicons import LANGUAGES
from tests.tiny import tiny_config

TRAIN = LanguageTrainConfig(steps_nlt=3, steps_le=2, batch_size=8, warmup_steps=1, threads=1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from synthetic.synth import SynthConfig, generate_catalogue

    catalogue = tmp_path_factory.mktemp("catalogue")
    config = SynthConfig(seed=0, n_train=20, n_val=0, n_test=8, image_size=32, languages=(*LANGUAGES, "it"))
    generate_catalogue(catalogue, config, workers=1)
    base = tmp_path_factory.mktemp("base")
    torch.manual_seed(0)
    model = CCRkModel(tiny_config(vocab_size=600, pooling="mean")).eval()
    texts = [t for r in load_split(catalogue / "train.jsonl") for lang in LANGUAGES for t in r.captions[lang]]
    model.save_pretrained(base, train_tokenizer(texts, 600, 32))
    return base, catalogue


def test_grid_runs_every_cell_and_summarises_over_seeds(setup: tuple[Path, Path]) -> None:
    base, catalogue = setup
    result = add_language_noise(
        base, catalogue, ["it"], [0.0, 0.5], [0, 1], TRAIN, objectives=("mla", "cl2cm"), log=lambda _: None
    )
    runs = result["runs"]
    assert len(runs) == 1 * 2 * 2 * 2 and result["n_test_images"] == 8
    assert {(r["noise"], r["seed"], r["objective"]) for r in runs} == {
        (n, s, o) for n in (0.0, 0.5) for s in (0, 1) for o in ("mla", "cl2cm")
    }
    assert len({r["IR_native_mean_R@1"] for r in runs}) == 1  # the frozen tower's, whatever was added
    for run in runs:
        assert run["damage"]["slots"] == 40 and run["damage"]["corrupted"] == round(run["noise"] * 40)
        assert set(run["stage_seconds"]) == ({"nlt", "le"} if run["objective"] == "mla" else {"cl", "le"})
        assert 0.0 <= run["IR"]["R@1"] <= run["IR"]["R@5"] <= 1.0 and run["mrv_IR"] >= 0.0
    assert len(result["summary"]) == 4
    row = next(r for r in result["summary"] if r["noise"] == 0.5 and r["objective"] == "cl2cm")
    values = [r["IR"]["R@1"] for r in runs if r["noise"] == 0.5 and r["objective"] == "cl2cm"]
    assert row["IR_R@1"] == {"mean": statistics.fmean(values), "sd": statistics.stdev(values)}
    table = format_noise_table(result).splitlines()
    assert len(table) == 2 + 4 and table[-1].startswith("| it | 50% | cl2cm |")


def test_cli_writes_json_and_table(setup: tuple[Path, Path], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ccrk_cli.main import app

    base, catalogue = setup
    out = tmp_path / "noise.json"
    args = [
        "experiment", "add-language-noise", "--output", str(out), "--data", str(catalogue),
        "--model", str(base), "--languages", "it", "--noise", "0.25", "--seeds", "3",
        "--objectives", "mla+cl2cm", "--steps-nlt", "2", "--steps-le", "1", "--batch-size", "4",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    assert written["runs"][0]["objective"] == "mla+cl2cm" and written["runs"][0]["damage"]["corrupted"] == 10
    assert written["catalogue"]["source"] == "given" and written["train"]["steps_nlt"] == 2
    assert out.with_suffix(".md").read_text().splitlines()[2].startswith("| it | 25% | mla+cl2cm |")
    bad = CliRunner().invoke(app, [*args[:6], "--languages", "en", "--data", str(catalogue)])
    assert bad.exit_code == 2 and "not synthetic languages new" in " ".join(bad.output.split())
