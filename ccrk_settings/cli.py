"""``ccrk config``: the configuration reference and the values a process would use."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

config_app = typer.Typer(
    help="Configuration: every CCRK_ variable, and the values in effect.", no_args_is_help=True
)


@config_app.command("reference")
def reference_command(
    fmt: Annotated[str, typer.Option("--format", help="markdown, or env (a commented .env template).")] = (
        "markdown"
    ),
    out: Annotated[Path | None, typer.Option(help="Write here instead of printing.")] = None,
    check: Annotated[
        bool, typer.Option("--check", help="With --out: exit 1 when the file differs instead of writing it.")
    ] = False,
) -> None:
    """Every CCRK_ variable with its type, default and meaning, generated from the Settings class."""
    from ccrk_settings.reference import reference

    if fmt not in ("markdown", "env"):
        raise typer.BadParameter(f"--format must be markdown or env, got {fmt!r}")
    text = reference(fmt)  # type: ignore[arg-type]
    if out is None:
        typer.echo(text, nl=False)
        return
    if check:
        current = out.read_text(encoding="utf-8") if out.is_file() else None
        if current != text:
            typer.echo(f"{out} is out of date: run `ccrk config reference --out {out}`", err=True)
            raise typer.Exit(code=1)
        typer.echo(f"{out} is up to date")
        return
    out.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {out}")


@config_app.command("show")
def show_command() -> None:
    """Every setting as this process resolves it (environment, .env, defaults); secrets masked."""
    from pydantic import ValidationError

    from ccrk_settings import get_settings
    from ccrk_settings.reference import effective, env_name

    try:
        settings = get_settings()
    except ValidationError as exc:
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else "?"
            typer.echo(f"error: {env_name(field)}: {err['msg']} (got {err.get('input')!r})", err=True)
        raise typer.Exit(code=2) from None
    for name, value in effective(settings):
        typer.echo(f"# {name} is unset" if value is None else f"{name}={value}")
