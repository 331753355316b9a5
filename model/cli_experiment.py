"""``ccrk experiment``: controlled comparisons of training objectives (1-to-K against 1-to-1; adding
languages from noisy data). Heavy imports happen inside the commands so ``ccrk --help`` stays fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from model.cli_common import BatchSize, CatalogueDir, Epochs, LearningRate, PresetName, console, fail

experiment_app = typer.Typer(help="Controlled comparisons of training objectives.", no_args_is_help=True)


@experiment_app.command("kcl-vs-one2one")
def kcl_vs_one2one_command(
    data: CatalogueDir = Path("data/synth"),
    output: Annotated[Path, typer.Option(help="Folder for the runs and the result JSON.")] = Path(
        "runs/kcl-vs-one2one"
    ),
    preset: PresetName = "demo",
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds (at least 3 for a spread).")] = "0,1,2",
    epochs: Epochs = 4,
    batch_size: BatchSize = 32,
    lr: LearningRate = 1e-3,
    train_limit: Annotated[int | None, typer.Option(help="First N training images.")] = 2000,
    test_limit: Annotated[int | None, typer.Option(help="First N test images.")] = None,
    threads: int = 2,
) -> None:
    """Train 1-to-K and 1-to-1 with the same config, budget and seeds; compare them on the same test split."""
    from model.configs import ConfigError, get_preset
    from model.experiments import format_comparison, kcl_vs_one2one
    from model.training import TrainConfig, TrainingError

    try:
        model_config = get_preset(preset)
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except (ConfigError, ValueError) as exc:
        raise fail(str(exc)) from exc
    base = TrainConfig(
        data_dir=data,
        output_dir=output,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=lr,
        train_limit=train_limit,
        val_limit=0,
        threads=threads,
    )
    try:
        result = kcl_vs_one2one(
            model_config, base, seed_list, data / "test.jsonl", test_limit=test_limit, log=console.print
        )
    except (TrainingError, ValueError) as exc:
        raise fail(str(exc)) from exc
    output.mkdir(parents=True, exist_ok=True)
    (output / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    table = format_comparison(result)
    (output / "result.md").write_text(table + "\n", encoding="utf-8")
    print(json.dumps(result["summary"], indent=2))
    print(table)


@experiment_app.command("add-language-noise")
def add_language_noise_command(
    output: Annotated[Path, typer.Option(help="JSON result to write; the markdown table goes beside it.")],
    data: Annotated[
        Path | None,
        typer.Option(help="Catalogue folder with train/test.jsonl in the languages; default: generate one."),
    ] = None,
    model: Annotated[Path | None, typer.Option(help="Frozen model directory (default: the demo).")] = None,
    languages: Annotated[str, typer.Option(help="Languages to add, comma-separated.")] = "ar,it",
    noise: Annotated[str, typer.Option(help="Noise rates, comma-separated (0..1).")] = "0,0.2,0.4",
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds (at least 3 for a spread).")] = "0,1,2",
    objectives: Annotated[
        str, typer.Option(help="Comma-separated: mla, cl2cm, mla+cl2cm.")
    ] = "mla,cl2cm,mla+cl2cm",
    steps_nlt: Annotated[int, typer.Option(min=0, help="NLT / CL stage steps.")] = 150,
    steps_le: Annotated[int, typer.Option(min=0, help="LE steps.")] = 75,
    batch_size: BatchSize = 64,
    kd_weight: Annotated[float, typer.Option(min=0.0)] = 0.1,
    word_weight: Annotated[float, typer.Option(min=0.0)] = 1.0,
    n_train: Annotated[int, typer.Option(min=2, help="Generated catalogue: training items.")] = 1000,
    n_test: Annotated[int, typer.Option(min=2, help="Generated catalogue: test items.")] = 300,
    eval_split: Annotated[str, typer.Option(help="test, or val to choose settings.")] = "test",
    threads: Annotated[int, typer.Option(min=1)] = 1,
) -> None:
    """Add languages from machine-translation-like noisy data (0/20/40 % of the captions corrupted) with MLA,
    CL2CM and both, several seeds; evaluate on clean held-out captions (R@1, MRV over all languages)."""
    import sys
    import tempfile

    from ccrk_settings import DEFAULT_MODEL_DIR
    from model.language_training import LanguageTrainConfig
    from model.noise_experiment import add_language_noise, format_noise_table
    from synthetic.lexicons import LANGUAGES, LEXICONS
    from synthetic.noise import NoiseError
    from synthetic.synth import SynthConfig, generate_catalogue

    try:
        langs = [x.strip() for x in languages.split(",") if x.strip()]
        rates = [float(x) for x in noise.split(",") if x.strip()]
        seed_list = [int(x) for x in seeds.split(",") if x.strip()]
        names = [x.strip() for x in objectives.split(",") if x.strip()]
        cfg = LanguageTrainConfig(
            steps_nlt=steps_nlt,
            steps_le=steps_le,
            batch_size=batch_size,
            warmup_steps=20,
            kd_weight=kd_weight,
            word_weight=word_weight,
            threads=threads,
        )
    except ValueError as exc:
        raise fail(f"bad option: {exc}") from exc
    unknown = [x for x in langs if x not in LEXICONS or x in LANGUAGES]
    if unknown:
        raise fail(f"--languages: {unknown} are not synthetic languages new to the demo model")
    with tempfile.TemporaryDirectory() as tmp:
        source = "given"
        if data is None:
            synth = SynthConfig(
                seed=0, n_train=n_train, n_val=200, n_test=n_test, languages=(*LANGUAGES, *langs)
            )
            data = Path(tmp) / "catalogue"
            generate_catalogue(data, synth, workers=1)
            source = f"generated: {synth}"
        try:
            result = add_language_noise(
                model or DEFAULT_MODEL_DIR,
                data,
                langs,
                rates,
                seed_list,
                cfg,
                names,
                log=console.print,
                eval_split=eval_split,
            )
        except (NoiseError, ValueError, OSError) as exc:
            raise fail(str(exc)) from exc
    result["catalogue"] = {"path": str(data), "source": source}
    result["command"] = "ccrk experiment add-language-noise " + " ".join(sys.argv[3:])
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    table = format_noise_table(result)
    output.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
    print(table)
