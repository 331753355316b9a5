"""``ccrk train`` and ``ccrk eval``: train a CCRk model, and measure one. Heavy imports happen inside the
commands so ``ccrk --help`` stays fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from model.cli_common import BatchSize, CatalogueDir, Epochs, LearningRate, PresetName, console, fail


def train_command(
    data: CatalogueDir = Path("data/synth"),
    output: Annotated[Path, typer.Option(help="Run folder: checkpoints and the final model/.")] = Path(
        "runs/demo"
    ),
    preset: PresetName = "demo",
    objective: Annotated[str, typer.Option(help="kcl (1-to-K) or one2one.")] = "kcl",
    epochs: Epochs = 10,
    batch_size: BatchSize = 64,
    lr: LearningRate = 1e-3,
    seed: int = 0,
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many steps.")] = None,
    train_limit: Annotated[int | None, typer.Option(help="Use only the first N training records.")] = None,
    itm_weight: float = 1.0,
    mlm_weight: float = 1.0,
    translation_weight: Annotated[float, typer.Option(help="MURAL text-text term weight.")] = 0.0,
    parallel_data: Annotated[Path | None, typer.Option(help="TSV/jsonl translation pairs.")] = None,
    tokenizer: Annotated[Path | None, typer.Option(help="Tokenizer folder (default: train one).")] = None,
    save_every_steps: Annotated[int | None, typer.Option(help="Extra checkpoints inside epochs.")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda[:N].")] = "auto",
    threads: Annotated[int, typer.Option(help="CPU threads.")] = 2,
    init: Annotated[
        Path | None,
        typer.Option(
            help="Fine-tune: start from this model directory (its config and tokenizer; --preset ignored)."
        ),
    ] = None,
) -> None:
    """Train a CCRk model; re-running the same command resumes from the newest checkpoint."""
    from model.configs import ConfigError, get_preset
    from model.modeling import read_config
    from model.training import TrainConfig, Trainer, TrainingError

    if objective not in ("kcl", "one2one"):
        raise fail(f"--objective must be kcl or one2one, got {objective!r}")
    try:
        model_config = read_config(init) if init is not None else get_preset(preset)
    except (ConfigError, OSError, ValueError) as exc:
        raise fail(f"cannot read the model config of {init}: {exc}" if init else str(exc)) from exc
    cfg = TrainConfig(
        data_dir=data,
        output_dir=output,
        objective=objective,  # type: ignore[arg-type]
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=lr,
        seed=seed,
        max_steps=max_steps,
        train_limit=train_limit,
        itm_weight=itm_weight,
        mlm_weight=mlm_weight,
        translation_weight=translation_weight,
        parallel_data=parallel_data,
        tokenizer_dir=tokenizer,
        save_every_steps=save_every_steps,
        device=device,
        threads=threads,
        init_from=init,
    )
    try:
        result = Trainer(model_config, cfg, log=console.print).run()
    except (TrainingError, ValueError, FileNotFoundError) as exc:
        raise fail(str(exc)) from exc
    console.print(
        f"trained {result.steps} steps ({result.epochs_completed} epochs) in {result.seconds:.1f} s, "
        f"{result.samples_per_second:.1f} samples/s; model saved to {result.model_dir}"
    )


def eval_command(
    model: Annotated[Path, typer.Option(help="Model directory (config.json, model.safetensors, tokenizer).")],
    data: Annotated[Path, typer.Option(help="A split jsonl, or a catalogue folder (uses test.jsonl).")],
    rerank_k: Annotated[
        int | None, typer.Option(min=1, help="Also re-rank the top k with the fusion encoder.")
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Evaluate the first N images only.")] = None,
    dump_ranks: Annotated[
        Path | None, typer.Option(help="Write every instance's rank per language here.")
    ] = None,
    json_out: Annotated[Path | None, typer.Option(help="Write the JSON report here (also printed).")] = None,
    batch_size: int = 128,
    backend: Annotated[str, typer.Option(help="torch, or onnx (the exported graphs, as served).")] = "torch",
    int8: Annotated[bool, typer.Option(help="With onnx: the int8 query and fusion graphs.")] = False,
    rerank_score: Annotated[
        str,
        typer.Option(
            help="Re-rank score: dual_plus_margin (the product's: dual logit + match log-odds) or itm_logit "
            "(the paper's: match logit alone, to reproduce published numbers)."
        ),
    ] = "dual_plus_margin",
    device: str = "auto",
    threads: int = 2,
) -> None:
    """Per-language Recall@1/5/10 (IR and TR), mean recall, MRV and mrv_std, with and without re-ranking."""
    import torch

    from model.evaluation import evaluate_encoder, format_table
    from model.model_dir import declared_architecture, load_model_config
    from model.preprocessing import ImagePreprocessor
    from model.reranking import check_rerank_score
    from model.runtime import EncoderError, load_encoder
    from model.training import TrainingError, resolve_device
    from model.training_data import load_captioned_images

    split = data / "test.jsonl" if data.is_dir() else data
    if not split.is_file():
        raise fail(f"evaluation split not found: {split}")
    if backend not in ("torch", "onnx"):
        raise fail(f"--backend must be torch or onnx, got {backend!r}")
    try:
        score = check_rerank_score(rerank_score)
    except ValueError as exc:
        raise fail(f"--rerank-score: {exc}") from exc
    starter = declared_architecture(model) == "conse"
    if starter and rerank_k is not None:
        raise fail(f"{model} is a starter model: it has no fusion encoder to re-rank with (drop --rerank-k)")
    try:
        dev = resolve_device(device)
        if dev.type == "cpu":
            torch.set_num_threads(threads)
        # The torch runtime runs on the device asked for (cuda:1 included); ONNX Runtime takes its type.
        on = str(dev) if backend == "torch" and not int8 and not starter else dev.type
        encoder = load_encoder(model, backend, device=on, threads=threads, int8=int8)
        preprocessor = ImagePreprocessor(load_model_config(model).vision)
        records = load_captioned_images(split, preprocessor, limit=limit, threads=threads)
    except (TrainingError, EncoderError, ValueError) as exc:
        raise fail(str(exc)) from exc
    with torch.inference_mode():
        result = evaluate_encoder(encoder, records, rerank_k, batch_size, score)
    report = result.report()
    report["backend"] = backend + ("-int8" if int8 else "")
    report["model"] = str(model)
    report["data"] = str(split)
    text = json.dumps(report, indent=2)
    print(text)
    console.print(format_table(report))
    if json_out:
        json_out.write_text(text + "\n", encoding="utf-8")
    if dump_ranks:
        dump_ranks.write_text(json.dumps(result.rank_dump()) + "\n", encoding="utf-8")
