"""Command-line interface of the model package: ``ccrk data``, ``ccrk train``, ``ccrk eval``,
``ccrk model``, ``ccrk export``, ``ccrk experiment``. Heavy imports happen inside commands so ``ccrk --help``
stays fast. Over 400 lines because it holds every model command, each a thin typer wrapper (options, error
messages) around a library function; splitting it per command would only scatter the shared options."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from model.cli_languages import add_language_command

console = Console(stderr=True)
data_app = typer.Typer(help="Make and inspect training data.", no_args_is_help=True)
model_app = typer.Typer(help="Convert and inspect model directories.", no_args_is_help=True)


# Options shared by several commands, declared once.
CatalogueDir = Annotated[
    Path, typer.Option("--data", help="Catalogue folder (train.jsonl, val.jsonl, test.jsonl).")
]
PresetName = Annotated[
    str, typer.Option("--preset", "--config", help="Model preset name or config JSON path.")
]
Epochs = Annotated[int, typer.Option(min=1)]
BatchSize = Annotated[int, typer.Option(min=2)]
LearningRate = Annotated[
    float, typer.Option("--lr", help="Peak learning rate (1e-3 suits training from scratch).")
]


def fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


@data_app.command("synth")
def data_synth(
    out: Annotated[Path, typer.Option(help="Output folder for the catalogue.")] = Path("data/synth"),
    seed: Annotated[int, typer.Option(help="Everything is deterministic from this seed.")] = 0,
    n_train: Annotated[int, typer.Option(help="Training images.")] = 20000,
    n_val: Annotated[int, typer.Option(help="Validation images.")] = 500,
    n_test: Annotated[int, typer.Option(help="Test images (each attribute combination unique).")] = 1000,
    image_size: Annotated[int, typer.Option(help="Rendered image size in pixels.")] = 96,
    captions_per_language: Annotated[int, typer.Option(help="Aligned phrasings per image and language.")] = 2,
    shop_titles: Annotated[
        str | None,
        typer.Option(
            help="Also a shop-style product title per item in this language (de), the field `title` that "
            "hybrid search reads (`ccrk index build --text-fields title`)."
        ),
    ] = None,
) -> None:
    """Generate the synthetic multilingual product catalogue (images + captions in ten languages)."""
    from tqdm.auto import tqdm

    from synthetic.synth import SynthConfig, generate_catalogue

    try:
        config = SynthConfig(
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            image_size=image_size,
            captions_per_language=captions_per_language,
            shop_titles=shop_titles,
        )
    except ValueError as exc:
        raise fail(str(exc)) from exc
    bar = tqdm(total=n_train + n_val + n_test, unit="img", desc="rendering")

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        summary = generate_catalogue(out, config, progress=progress)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    finally:
        bar.close()
    console.print(f"catalogue written to {out}: {summary}", markup=False)


@data_app.command("pairs")
def pairs_command(
    data: Annotated[Path, typer.Option(help="A split jsonl, or a catalogue folder (uses train.jsonl).")],
    out: Annotated[Path, typer.Option(help="TSV of translation pairs to write.")],
    per_record: Annotated[int, typer.Option(min=1, help="Pairs drawn per catalogue record.")] = 4,
    seed: int = 0,
    source: Annotated[
        str | None, typer.Option(help="Only (SOURCE, TARGET) pairs, e.g. --source en --target ko.")
    ] = None,
    target: Annotated[str | None, typer.Option(help="With --source: the pairs' second language.")] = None,
    noise: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Share of the TARGET captions given a machine-translation-like error (wrong attribute "
            "word, agreement, dropped word, copied source word); logged per pair in OUT.noise.jsonl.",
        ),
    ] = 0.0,
    noise_seed: Annotated[int | None, typer.Option(help="Seed of the noise (default: --seed).")] = None,
    captions_out: Annotated[
        Path | None,
        typer.Option(
            help="Also write the split with the same noisy TARGET captions (a catalogue jsonl for "
            "`ccrk model add-language --captions`, LE)."
        ),
    ] = None,
) -> None:
    """Translation pairs (one image's captions in two languages) for MURAL's text-text term
    (`ccrk train --translation-weight W --parallel-data OUT`), or, with --source/--target, (native, new)
    pairs for `ccrk model add-language --parallel OUT`, optionally with dialled translation noise."""
    from model.parallel_corpus import pairs_from_catalogue, write_pairs_tsv
    from synthetic.catalogue import CatalogueFormatError, load_split
    from synthetic.noise import NoiseError, corrupt_records, summarise, write_log, write_records

    if (source is None) != (target is None):
        raise fail("--source and --target go together")
    if (noise > 0 or captions_out is not None) and target is None:
        raise fail("--noise and --captions-out need --source and --target (the noisy side is TARGET)")
    split = data / "train.jsonl" if data.is_dir() else data
    if not split.is_file():
        raise fail(f"catalogue split not found: {split}")
    try:
        records = load_split(split)
        log = None
        if target is not None and source is not None and (noise > 0 or captions_out is not None):
            records, log = corrupt_records(
                records, target, source, noise, seed if noise_seed is None else noise_seed
            )
        pairs = pairs_from_catalogue(records, per_record, seed, source=source, target=target)
    except (CatalogueFormatError, NoiseError) as exc:
        raise fail(f"{split}: {exc}") from exc
    if len(pairs) < 2:
        needs = f"captions in {source!r} and {target!r}" if source else "captions in at least two languages"
        raise fail(f"{split} yields {len(pairs)} pairs: records need {needs}")
    write_pairs_tsv(pairs, out)
    console.print(f"wrote {len(pairs)} translation pairs to {out}", markup=False)
    if log is not None:
        # pairs_from_catalogue's order: records in order, slots 0.. of those with both languages.
        lines: dict[tuple[str, int], int] = {}
        for record in records:
            if source is not None and record.captions.get(source) and target and record.captions.get(target):
                slots = min(len(record.captions[source]), len(record.captions[target]), per_record)
                for j in range(slots):
                    lines[(record.id, j)] = len(lines) + 1
        in_pairs = [e for e in log if (e.id, e.slot) in lines]
        noise_log = out.with_name(out.name + ".noise.jsonl")
        write_log(in_pairs, noise_log, lines={(e.id, e.slot): lines[(e.id, e.slot)] for e in in_pairs})
        stats = summarise(in_pairs)
        console.print(
            f"noise: {stats['corrupted']} of {stats['slots']} pairs corrupted ({stats['rate']:.1%}), "
            f"{stats['kinds']}; per pair in {noise_log}"
        )
    if captions_out is not None:
        write_records(records, captions_out)
        console.print(f"wrote the split with noisy {target} captions to {captions_out}", markup=False)


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
