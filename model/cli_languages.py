"""``ccrk model add-language`` (registered on ``model.cli.model_app``): teach a frozen model a new language
with MLA's language acquisition encoder (``model.add_language``). Heavy imports happen inside the command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True)


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def add_language_command(
    model: Annotated[Path, typer.Option(help="Model directory (left unchanged).")],
    lang: Annotated[str, typer.Option(help="The new language's code, e.g. ko.")],
    out: Annotated[
        Path, typer.Option(help="New model directory: the model, byte for byte, plus the language.")
    ],
    parallel: Annotated[
        Path | None,
        typer.Option(
            help="TSV of 'native<TAB>new' sentence pairs (NLT); `ccrk data pairs --source --target`."
        ),
    ] = None,
    captions: Annotated[
        Path | None,
        typer.Option(help="Catalogue jsonl (or folder: train.jsonl) with captions[LANG] and image (LE)."),
    ] = None,
    native: Annotated[str, typer.Option(help="The language of the pairs' first column.")] = "en",
    steps_nlt: Annotated[
        int, typer.Option(min=0, help="NLT steps (the CL stage's with --objective cl2cm).")
    ] = 600,
    steps_le: Annotated[int, typer.Option(min=0, help="Language Exposure steps (with --captions).")] = 300,
    batch_size: Annotated[int, typer.Option(min=2)] = 64,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate of the new parameters.")] = 2e-3,
    bottleneck: Annotated[int, typer.Option(min=1, help="Adapter width after each text layer.")] = 64,
    vocab_size: Annotated[
        int, typer.Option(min=300, help="Upper bound of the language's vocabulary.")
    ] = 4000,
    seed: int = 0,
    threads: Annotated[int, typer.Option(min=1, help="CPU threads.")] = 2,
    objective: Annotated[
        str,
        typer.Option(
            help="mla (NLT then LE), cl2cm (CL2CM: cross-lingual stage with word alignment, then LE with "
            "relational distillation) or mla+cl2cm (both); see docs/how-to/add-language-objectives.md."
        ),
    ] = "mla",
    word_weight: Annotated[float, typer.Option(min=0.0, help="CL2CM word-alignment weight.")] = 1.0,
    kd_weight: Annotated[float, typer.Option(min=0.0, help="CL2CM relational distillation weight.")] = 0.1,
) -> None:
    """Add a language to a frozen model without re-embedding any image: a language acquisition encoder
    (own tokenizer, new embeddings, adapters after the frozen text layers) trained by NLT on parallel
    sentences and, with --captions, LE on captioned images. The model's files are copied unchanged, so
    every index built with it still fits. --objective cl2cm trains CL2CM's cross-lingual stage instead of
    NLT and adds its relational distillation to LE (measured no better than mla on noisy synthetic
    translations: docs/how-to/add-language-objectives.md)."""
    from model.add_language import AddLanguageError, add_language
    from model.language_training import LanguageTrainConfig

    if out.resolve() == model.resolve():
        raise _fail("--out must be a new folder, not --model")
    try:
        cfg = LanguageTrainConfig(
            steps_nlt=steps_nlt,
            steps_le=steps_le,
            batch_size=batch_size,
            learning_rate=lr,
            bottleneck=bottleneck,
            vocab_size=vocab_size,
            seed=seed,
            threads=threads,
            objective=objective,
            word_weight=word_weight,
            kd_weight=kd_weight,
        )
        result = add_language(
            model,
            lang,
            parallel=parallel,
            captions=captions,
            out=out,
            native=native,
            config=cfg,
            log=console.print,
        )
    except (AddLanguageError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    report = result.report
    tok = report["tokenizer"]
    console.print(
        f"{lang}: {report['parameters_added']:,} parameters added "
        f"({report['parameters_added'] / report['parameters_base']:.1%} of the model); "
        f"{tok['tokens_per_text_own']:.1f} tokens a text with its own vocabulary "
        f"({tok['vocab_size']}), {tok['tokens_per_text_shared']:.1f} with the model's"
    )
    console.print(
        f"model directory with {lang} written to {result.out} (objective {objective})", markup=False
    )
