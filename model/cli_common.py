"""What the model package's commands share (``model.cli``, ``cli_data``, ``cli_train``,
``cli_experiment``): the error console, ``fail``, and options declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True)


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
