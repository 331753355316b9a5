"""``ccrk model`` (convert, add a language, list presets, build the starter) and ``ccrk export`` (ONNX
graphs, the int8 cost). The package's other command groups: ``cli_data`` (``ccrk data``), ``cli_train``
(``ccrk train``, ``ccrk eval``), ``cli_experiment`` (``ccrk experiment``), ``cli_languages``
(``ccrk model add-language``). Heavy imports happen inside the commands so ``ccrk --help`` stays fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from model.cli_common import console, fail
from model.cli_languages import add_language_command

model_app = typer.Typer(help="Convert and inspect model directories.", no_args_is_help=True)


@model_app.command("convert-official")
def convert_official(
    checkpoint: Annotated[Path, typer.Argument(help="ccrk_*_epoch_29.th file.")],
    out: Annotated[Path, typer.Option(help="Model directory to write.")],
    tokenizer: Annotated[Path, typer.Option(help="Local tokenizer folder (XLM-R's).")],
    preset: Annotated[
        str,
        typer.Option(
            help="Architecture preset or config JSON: ccrk-paper-224 is the released files' own shape; "
            "ccrk-paper is the 384 px fine-tuning shape (Swin tables resized bicubically, as the authors do)."
        ),
    ] = "ccrk-paper-224",
    strict: Annotated[bool, typer.Option(help="Fail on any missing or unexpected key.")] = False,
    allow_pickle: Annotated[
        bool,
        typer.Option(
            "--allow-pickle",
            help="Read a full training save (optimizer and random states beside the weights) by unpickling "
            "it, which runs code from the file: only for a file whose source you trust.",
        ),
    ] = False,
    max_length: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Text truncation length of the model directory (the paper: 40 for COCO and Multi30K, 80 for "
            "xFlickr&CO and WIT); default: the preset's.",
        ),
    ] = None,
) -> None:
    """Load an official CCRk checkpoint by key mapping and save it as a model directory."""
    from dataclasses import replace

    from model.configs import ConfigError, get_preset
    from model.modeling import CheckpointError
    from model.official_checkpoint import load_official_checkpoint
    from model.tokenization import TokenizerError, load_tokenizer

    if not checkpoint.is_file():
        raise fail(f"checkpoint not found: {checkpoint}")
    if allow_pickle:
        console.print(
            "[yellow]warning:[/yellow] --allow-pickle: a file that the safe loader refuses is unpickled, "
            "which runs code from it; use this only for a checkpoint whose source you trust"
        )
    try:
        config = get_preset(preset)
        if max_length is not None:
            # replace() re-runs the config's checks: the length must fit the position table.
            config = replace(config, text=replace(config.text, max_length=max_length))
        tok = load_tokenizer(tokenizer)
        net, report = load_official_checkpoint(checkpoint, config, strict=strict, allow_pickle=allow_pickle)
    except (ConfigError, CheckpointError, TokenizerError) as exc:
        raise fail(str(exc)) from exc
    console.print(report.summary())
    net.save_pretrained(out, tok)
    console.print(f"model directory written to {out}", markup=False)


export_app = typer.Typer(help="Export a model directory for serving runtimes.", no_args_is_help=True)


@export_app.command("onnx")
def export_onnx_command(
    model: Annotated[Path, typer.Option(help="Model directory; the graphs go to MODEL/onnx/.")],
    int8: Annotated[bool, typer.Option(help="Also write int8 (dynamic) query and fusion graphs.")] = False,
) -> None:
    """Export the query path, the image path and the fusion scorer as ONNX graphs (dynamic batch and
    sequence axes) into the model directory."""
    from model.export import ExportError, export_onnx, quantize_int8
    from model.modeling import CCRkModel, CheckpointError

    try:
        net = CCRkModel.from_pretrained(model)
        graphs = export_onnx(net, model)
        extra = quantize_int8(model) if int8 else []
    except (CheckpointError, ExportError) as exc:
        raise fail(str(exc)) from exc
    for path in (graphs.text, graphs.image, graphs.fusion, *extra):
        console.print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)", markup=False)


@export_app.command("int8-cost")
def int8_cost_command(
    model: Annotated[Path, typer.Option(help="Model directory with fp32 and int8 ONNX graphs.")],
    data: Annotated[Path, typer.Option(help="A split jsonl, or a catalogue folder (uses test.jsonl).")],
    rerank_k: Annotated[
        int, typer.Option(min=0, help="Also measure through re-ranking of the top k (0: dual only).")
    ] = 16,
    limit: Annotated[int | None, typer.Option(min=1, help="Measure on the first N images only.")] = None,
    threads: int = 2,
) -> None:
    """Measure what the int8 graphs cost in mean recall and MRV against fp32 and record it in the export
    manifest; serving uses int8 only where this cost is within CCRK_INT8_MAX_RECALL_DROP/_MRV_INCREASE."""
    from model.evaluation import int8_cost
    from model.export import ExportError, record_int8_cost
    from model.modeling import read_config
    from model.preprocessing import ImagePreprocessor
    from model.runtime import EncoderError, load_encoder
    from model.training_data import load_captioned_images

    split = data / "test.jsonl" if data.is_dir() else data
    if not split.is_file():
        raise fail(f"evaluation split not found: {split}")
    try:
        fp32 = load_encoder(model, "onnx", device="cpu", threads=threads)
        quant = load_encoder(model, "onnx", device="cpu", threads=threads, int8=True)
        records = load_captioned_images(
            split, ImagePreprocessor(read_config(model).vision), limit=limit, threads=threads
        )
        cost = int8_cost(fp32, quant, records, rerank_k or None)
        cost["data"] = str(split)
        record_int8_cost(model, cost)
    except (EncoderError, ExportError, ValueError) as exc:
        raise fail(str(exc)) from exc
    print(json.dumps(cost, indent=2))
    console.print(
        f"int8 costs at most {cost['max_mean_recall_drop_points']:.2f} points of mean recall and "
        f"{cost['max_mrv_increase']:+.3f} MRV; recorded in {model}/onnx/"
    )


model_app.command("add-language")(add_language_command)


@model_app.command("presets")
def presets() -> None:
    """List the built-in model presets."""
    from model.configs import list_presets

    for name in list_presets():
        print(name)


@model_app.command("build-starter")
def build_starter_command(
    out: Annotated[Path, typer.Option(help="Model directory to write.")],
    top_classes: Annotated[
        int, typer.Option(min=1, max=1000, help="Classes whose prototypes form an image embedding (T).")
    ] = 5,
    force: Annotated[bool, typer.Option(help="Replace an existing directory.")] = False,
) -> None:
    """Assemble the starter model from installed packages: EfficientNet-Lite0 (ImageNet-1k) joined to the
    multilingual Universal Sentence Encoder by ConSE. It searches real photos in 15 languages; nothing is
    downloaded. Serving it needs ONNX Runtime and numpy only."""
    from model.export import ExportError
    from model.starter.build import StarterBuildError, build_starter
    from model.starter.components import StarterModelError

    try:
        built = build_starter(out, top_classes=top_classes, force=force)
    except (StarterBuildError, StarterModelError, ExportError) as exc:
        raise fail(str(exc)) from exc
    languages = ", ".join(built.config.languages)
    console.print(
        f"starter model written to {built.out} (languages: {languages}; no re-ranking)", markup=False
    )
