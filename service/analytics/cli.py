"""``ccrk analytics``: the report of an index's query log, read from its file (no running service needed)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

analytics_app = typer.Typer(
    help="Search analytics: what shoppers ask per language, what finds nothing, what they click.",
    no_args_is_help=True,
)
console = Console()


@analytics_app.command("report")
def report_command(
    index: Annotated[str | None, typer.Option(help="The index (default: settings.index_name).")] = None,
    hours: Annotated[float, typer.Option(min=0.01, help="The window: the last this many hours.")] = 24.0,
    top: Annotated[int, typer.Option(min=1, max=100, help="Top queries per language.")] = 10,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the report as JSON here.")
    ] = None,
) -> None:
    """Per language: searches, the 'none' rate, CTR, MRR and their gap to the best language, the top
    queries and the top 'none' queries; then photo searches."""
    from ccrk_settings import SettingsError, settings_with
    from service.analytics import analytics_folder
    from store.analytics import AnalyticsError, QueryLog, analytics_path, analytics_report

    try:
        settings = settings_with({"index_name": index})
    except SettingsError as exc:
        raise typer.BadParameter(exc.describe()) from None
    name = settings.index_name
    path = analytics_path(analytics_folder(settings), name)
    if not path.is_file():
        typer.echo(f"Error: no query log for index {name!r} at {path} (no search logged yet?)", err=True)
        raise typer.Exit(2)
    now = time.time()
    try:
        with QueryLog(
            path,
            retention_s=settings.analytics_retention_days * 86400.0,
            max_rows=settings.analytics_max_rows,
        ) as query_log:
            report = analytics_report(query_log, since=now - hours * 3600.0, until=now, top=top)
    except AnalyticsError as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(2) from None
    table = Table(title=f"{name}: the last {hours:g} h ({report.log['queries']:,} searches logged)")
    for column in ("lang", "searches", "none", "CTR", "MRR", "CTR gap", "top queries", "top 'none' queries"):
        table.add_column(column)
    for x in report.languages:
        table.add_row(
            x.lang,
            f"{x.queries:,}",
            f"{x.none_rate:.1%}",
            f"{x.ctr:.1%}",
            f"{x.mrr:.3f}",
            f"{x.ctr_gap:.1%}",
            escape(", ".join(f"{q.query} ({q.count})" for q in x.top_queries[:5])),
            escape(", ".join(f"{q.query} ({q.count})" for q in x.top_none_queries[:5])),
        )
    console.print(table)
    p = report.photos
    console.print(
        f"photo searches: {p.queries:,}, nothing found {p.none_rate:.1%}, CTR {p.ctr:.1%}, MRR {p.mrr:.3f}; "
        f"found first most: {escape(', '.join(f'{q.query} ({q.count})' for q in p.top_products[:5]))}",
        highlight=False,
    )
    if json_out is not None:
        json_out.write_text(json.dumps(dataclasses.asdict(report), indent=2, ensure_ascii=False) + "\n")
