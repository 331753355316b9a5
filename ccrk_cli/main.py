"""``ccrk``: the product's single console script. Packages contribute their own sub-commands."""

from __future__ import annotations

import typer

from ccrk_cli.wiring import context_object
from ccrk_settings.cli import config_app
from indexer.cli import index_app
from model.cli import export_app, model_app
from model.cli_data import data_app
from model.cli_experiment import experiment_app
from model.cli_train import eval_command, train_command
from monitoring.cli import probe_app
from service.analytics.cli import analytics_app
from service.cli import serve_command
from service.keys_cli import keys_app

app = typer.Typer(
    name="ccrk",
    help="ccrk-search: multilingual image search with CCRk (train, evaluate, index, serve).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def ccrk(ctx: typer.Context) -> None:
    """ccrk-search: multilingual image search with CCRk (train, evaluate, index, serve)."""
    ctx.obj = context_object()  # index builds get monitoring's quality gate (ccrk_cli.wiring)


app.add_typer(data_app, name="data")
app.add_typer(model_app, name="model")
app.add_typer(export_app, name="export")
app.add_typer(experiment_app, name="experiment")
app.add_typer(index_app, name="index")
app.add_typer(probe_app, name="probe")
app.add_typer(config_app, name="config")
app.add_typer(keys_app, name="keys")
app.add_typer(analytics_app, name="analytics")
app.command("train")(train_command)
app.command("eval")(eval_command)
app.command("serve")(serve_command)


if __name__ == "__main__":
    app()
