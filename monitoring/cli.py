"""``ccrk probe``: make a probe set, run it against an index (in process) or a running service."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

probe_app = typer.Typer(
    help="Cross-language consistency probes: per-language Recall@K, MRV, overlap, latency.",
    no_args_is_help=True,
)
console = Console()
err_console = Console(stderr=True)


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


@probe_app.command("make-set")
def make_set_command(
    catalogue: Annotated[Path, typer.Option(help="Catalogue jsonl with captions (e.g. DIR/test.jsonl).")],
    out: Annotated[Path, typer.Option(help="Probe set jsonl to write.")],
    n: Annotated[int, typer.Option(min=1, help="Probes to draw.")] = 200,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    languages: Annotated[
        str | None, typer.Option(help="Comma-separated languages (default: all every item has).")
    ] = None,
) -> None:
    """Draw a probe set from a captioned catalogue: one probe per item, its first caption per language."""
    from monitoring.probe_set import probes_from_captions, save_probe_set
    from synthetic.catalogue import CatalogueFormatError, load_split

    try:
        records = load_split(catalogue)
    except (CatalogueFormatError, OSError) as exc:
        raise _fail(f"{catalogue}: {exc}") from None
    langs = [x.strip() for x in languages.split(",") if x.strip()] if languages else None
    probes = probes_from_captions([(r.id, r.captions) for r in records], n=n, seed=seed, languages=langs)
    if not probes:
        raise _fail(f"{catalogue}: no item has captions in two or more of the requested languages")
    save_probe_set(probes, out)
    console.print(
        f"wrote {len(probes)} probes in {len(probes[0].queries)} languages to {out}", highlight=False
    )


def _table(record: dict[str, Any]) -> Table:
    table = Table(
        title=f"probe run on {record.get('index_version')} ({record.get('model')}): "
        f"MRV {record['mrv']:.2f}, mrv_std {record['mrv_std']:.3f}, "
        f"mean overlap@10 {record['mean_overlap']:.3f}"
    )
    for col in ("lang", "R@1", "R@5", "R@10", "mean rank", "overlap@10", "p50 ms", "p95 ms"):
        table.add_column(col, justify="left" if col == "lang" else "right")
    for lang, m in record["per_language"].items():
        table.add_row(
            lang,
            f"{m['recall_at_1']:.3f}",
            f"{m['recall_at_5']:.3f}",
            f"{m['recall_at_10']:.3f}",
            f"{m['mean_rank']:.1f}",
            f"{m['overlap_at_10']:.3f}",
            f"{m['latency_ms_p50']:.2f}",
            f"{m['latency_ms_p95']:.2f}",
        )
    return table


@probe_app.command("run")
def run_command(
    probe_set: Annotated[Path | None, typer.Option(help="Probe set jsonl [CCRK_PROBE_SET].")] = None,
    url: Annotated[
        str | None, typer.Option(help="Probe a running service at this base URL (else: an index in process).")
    ] = None,
    index_root: Annotated[Path | None, typer.Option(help="Root of indexes [CCRK_INDEX_ROOT].")] = None,
    name: Annotated[str | None, typer.Option(help="Index name [CCRK_INDEX_NAME].")] = None,
    version: Annotated[str | None, typer.Option(help="Index version (default: CURRENT).")] = None,
    model: Annotated[Path | None, typer.Option(help="Model directory [CCRK_MODEL_DIR].")] = None,
    rerank: Annotated[
        bool | None, typer.Option("--rerank/--no-rerank", help="HTTP mode: re-rank (default: the service's).")
    ] = None,
    mode: Annotated[
        str,
        typer.Option(help="image, or hybrid / text on a version built with --text-fields (see /v1/search)."),
    ] = "image",
    store: Annotated[bool, typer.Option(help="Keep the run in the history (Redis or SQLite).")] = True,
    json_out: Annotated[Path | None, typer.Option(help="Also write the run record as JSON here.")] = None,
) -> None:
    """Run the probe set once and print per-language Recall@1/5/10, MRV, mrv_std, overlap@10, latency."""
    from ccrk_settings import SettingsError, settings_with
    from monitoring.history import HistoryError, open_history
    from monitoring.probe import HttpSearcher, ProbeError, index_searcher, run_probes, run_record
    from monitoring.probe_set import ProbeSetError, load_probe_set
    from store.errors import IndexFormatError
    from store.opening import open_version
    from store.version.manifest import model_fingerprint, model_name_of

    try:
        settings = settings_with(
            {"index_root": index_root, "index_name": name, "model_dir": model, "probe_set": probe_set}
        )
    except SettingsError as exc:
        raise _fail(exc.describe({"index_name": "--name", "model_dir": "--model"})) from None
    if settings.probe_set is None:
        raise _fail(
            "no probe set: pass --probe-set or set CCRK_PROBE_SET (make one with `ccrk probe make-set`)"
        )
    try:
        probes = load_probe_set(settings.probe_set)
        if url is not None:
            searcher = HttpSearcher(url, rerank=rerank, mode=None if mode == "image" else mode)
            try:
                metrics = run_probes(probes, searcher, depth=settings.probe_depth)
            finally:
                searcher.close()
        else:
            from model.runtime import load_encoder

            encoder = load_encoder(settings.model_dir, backend=settings.backend, threads=settings.threads)
            # Encoders load their text side on first use (the starter's sentence encoder: ~2.4 s on 2
            # cores): loaded now, so that the first probe's latency is a search's, as in the service.
            encoder.encode_text(["ready"])
            with open_version(
                settings.index_root,
                settings.index_name,
                version,
                expect_fingerprint=model_fingerprint(settings.model_dir),
            ) as index:
                search = index_searcher(index, encoder, model_name_of(settings.model_dir), mode=mode)
                metrics = run_probes(probes, search, depth=settings.probe_depth)
    except (ProbeSetError, ProbeError, IndexFormatError) as exc:
        raise _fail(str(exc)) from None
    record = run_record(metrics, source="cli", **({"mode": mode} if mode != "image" else {}))
    console.print(_table(record))
    if json_out is not None:
        json_out.write_text(json.dumps(record, indent=2, ensure_ascii=False), encoding="utf-8")
    if store:
        history = open_history(settings)
        try:
            history.add_run(record)
            console.print(f"stored in the history ({history.backend})", highlight=False)
        except HistoryError as exc:
            err_console.print(
                f"[yellow]warning:[/yellow] not stored: {escape(str(exc))}", highlight=False, soft_wrap=True
            )
        finally:
            history.close()
