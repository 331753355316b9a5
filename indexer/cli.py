"""``ccrk index``: build, add, delete, roll back, list and verify index versions.

A little over 400 lines because it holds every index command, each a thin typer wrapper (options, the
settings they override, the summary table); the work is in ``indexer.build`` and ``indexer.maintenance``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from ccrk_settings import Settings, SettingsError, settings_with
from indexer.errors import IndexerError
from indexer.quality_gate import gate_from_context
from indexer.report import describe_skipped
from model.configs import ConfigError
from model.runtime import EncoderError
from store.errors import IndexFormatError, IndexNotFoundError
from store.layout import MANIFEST_FILE
from store.synonyms import SynonymsError
from store.verify import model_to_verify, verify_version
from store.version import versions
from store.version.manifest import IndexManifest

index_app = typer.Typer(
    help="Build and manage versioned FAISS indexes of image collections.", no_args_is_help=True
)

Name = Annotated[str, typer.Option("--name", help="Index name (INDEX_ROOT/NAME).")]
IndexRoot = Annotated[Path | None, typer.Option(help="Root of all indexes (default: settings.index_root).")]
ModelDir = Annotated[
    Path | None, typer.Option("--model", help="Model directory (default: settings.model_dir).")
]
Sources = Annotated[
    list[Path],
    typer.Argument(help="Image folders, manifests (.jsonl/.csv: id, path, metadata...) or catalogue jsonl."),
]
Workers = Annotated[
    int | None, typer.Option(min=0, help="Decode worker processes (default: settings.index_workers)")
]
Threads = Annotated[int | None, typer.Option(min=1, help="Encoder threads (default: settings.threads)")]
BatchSize = Annotated[
    int | None, typer.Option(min=1, help="Images per encoder batch (default: settings.index_batch_size)")
]
ReportOut = Annotated[Path | None, typer.Option("--json-report", help="Also write the report as JSON here.")]
Engine = Annotated[
    str | None,
    typer.Option(help="local, or ray: a Ray cluster's actors encode the shards (default: settings.engine)."),
]
Address = Annotated[
    str | None, typer.Option("--address", help="--engine ray: the Ray head, HOST:PORT (settings.ray_address)")
]

console = Console()
err_console = Console(stderr=True)


class ItemsPerSecond(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text(f"{speed:,.0f} items/s" if speed else "- items/s", style="progress.data.speed")


@contextmanager
def _progress(label: str) -> Iterator[Callable[[int, int], None]]:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        ItemsPerSecond(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=err_console,
        transient=False,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


# The options of these commands that set a setting of another name, for error messages.
OPTION_OF_SETTING = {
    "index_workers": "--workers",
    "index_batch_size": "--batch-size",
    "index_shards": "--shards",
    "text_fields": "--text-fields",
    "ray_address": "--address",
}


def _settings(**overrides: Any) -> Settings:
    """The settings with this command's options applied (validated); a bad value exits naming its option."""
    try:
        return settings_with(overrides)
    except SettingsError as exc:
        raise _fail(exc.describe(OPTION_OF_SETTING)) from None


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except (IndexerError, IndexFormatError, EncoderError, ConfigError, SynonymsError) as exc:
        # EncoderError/ConfigError: the model directory cannot be opened (damaged, wrong package version).
        raise _fail(str(exc)) from None
    except OSError as exc:
        # E.g. an index root that cannot be created or written: the path and the reason, not a traceback.
        where = f"{exc.filename}: " if exc.filename else ""
        raise _fail(f"{where}{exc.strerror or exc}") from None


def _engine_row(report: Any) -> list[tuple[str, str]]:
    if report.engine != "ray":
        return []
    nodes = report.encode_nodes
    where = f"{len(nodes)} node" + ("s" if len(nodes) != 1 else "")
    return [("engine", f"ray: {sum(nodes.values())} shards encoded on {where}")]


def _summary(report: Any, json_report: Path | None) -> None:
    table = Table(title=f"ccrk index {report.operation}: {report.name}", show_header=False)
    state = " (published)" if report.published else " (nothing published)"
    if report.already_current:
        state = " (already CURRENT: nothing built or published)"
    rows: list[tuple[str, str]] = [
        ("version", f"{report.version or '-'}{state}"),
        ("live items", f"{report.count:,}"),
    ]
    if report.operation in ("build", "add"):
        rows += [
            (
                "items read",
                f"{report.items_total:,}"
                + (f" ({report.already_indexed:,} already indexed)" if report.already_indexed else ""),
            ),
            ("items indexed", f"{report.items_indexed:,}"),
            ("skipped (bad)", f"{len(report.skipped):,}"),
            ("shards", f"{report.shards} ({report.resumed_shards} resumed from an earlier run)"),
            *_engine_row(report),
            ("encode", f"{report.encode_seconds:.1f} s, {report.items_per_second:,.1f} items/s"),
        ]
        if report.operation == "build" and not report.already_current:
            rows.append(
                (
                    "reuse",
                    f"encoded {report.items_encoded:,} of {report.items_total:,}; "
                    f"reused {report.items_reused:,}"
                    f" (new {report.items_new:,}, changed {report.items_changed:,}, removed "
                    f"{report.items_removed:,})",
                )
            )
            if report.photos_encoded or report.photos_reused or report.texts_encoded or report.texts_reused:
                rows.append(
                    (
                        "product reuse",
                        f"photos: encoded {report.photos_encoded:,}, reused {report.photos_reused:,}; "
                        f"text values: encoded {report.texts_encoded:,}, reused {report.texts_reused:,}",
                    )
                )
        if report.ignored_files:
            rows.append(("ignored files", f"{report.ignored_files} (not images by suffix)"))
        if report.skipped_links:
            rows.append(("skipped links", f"{len(report.skipped_links)} (symbolic links not followed)"))
    rows += [
        (
            "index",
            (f"{report.index_shards} shards, " if report.index_shards > 1 else "")
            + f"{report.index_factory} {json.dumps(report.search_params)}"
            + (f" ({report.ann_index})" if report.ann_index else ""),
        ),
        (
            "recall@10 vs exact",
            "-" if report.measured_recall_at_10 is None else f"{report.measured_recall_at_10:.4f}",
        ),
        ("re-rank store", f"{report.rerank_bytes_per_image:,} bytes/image"),
        ("total time", f"{report.build_seconds:.1f} s"),
    ]
    if report.language_recall_at_10:
        rows.append(
            ("text->image R@10", ", ".join(f"{k} {v:.2f}" for k, v in report.language_recall_at_10.items()))
        )
    if report.pruned:
        rows.append(("pruned versions", ", ".join(report.pruned)))
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    for s in report.skipped[:20]:
        console.print(f"  skipped {describe_skipped(s)}", highlight=False, markup=False)
    if len(report.skipped) > 20:
        console.print(
            f"  ... and {len(report.skipped) - 20} more (all listed in the version's manifest.json)"
        )
    for link in report.skipped_links[:20]:
        console.print(
            f"  skipped link {link['path']} -> {link['target']}: {link['reason']}",
            highlight=False,
            markup=False,
        )
    if len(report.skipped_links) > 20:
        console.print(f"  ... and {len(report.skipped_links) - 20} more links (all in --json-report)")
    for note in report.notes:
        console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    if json_report is not None:
        data = dataclasses.asdict(report) | {"items_per_second": report.items_per_second}
        json_report.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")


@index_app.command("build")
def build_command(
    ctx: typer.Context,
    name: Name,
    sources: Sources,
    model: ModelDir = None,
    index_root: IndexRoot = None,
    index_factory: Annotated[
        str | None,
        typer.Option(help="faiss factory string overriding the automatic choice, e.g. 'HNSW32,Flat'."),
    ] = None,
    rerank_dtype: Annotated[
        str | None, typer.Option(help="fp16 or int8 (per-vector scale) (default: settings.rerank_dtype)")
    ] = None,
    workers: Workers = None,
    threads: Threads = None,
    batch_size: BatchSize = None,
    json_report: ReportOut = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Build and publish even when CURRENT already holds this build's result."
        ),
    ] = False,
    shards: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Index shards of the version (item id hash modulo S; each its own ANN index), for memory, "
            "not latency; 1: unsharded (default: settings.index_shards).",
        ),
    ] = None,
    engine: Engine = None,
    address: Address = None,
    text_fields: Annotated[
        str | None,
        typer.Option(
            "--text-fields",
            help="Manifest fields whose text is searched beside the photos (products and hybrid search), "
            "comma-separated, e.g. title,description (`title` also covers `title@de`); every field still "
            "comes back in metadata (default: settings.text_fields).",
        ),
    ] = None,
    synonyms: Annotated[
        Path | None,
        typer.Option(
            "--synonyms",
            help="A synonyms file (JSON, docs/how-to/products-and-hybrid-search.md) the version holds; "
            "checked first (a cycle or a broken limit names the file and entry).",
        ),
    ] = None,
) -> None:
    """Embed the sources into a new version and publish it (re-run after a crash to resume; a build whose
    result is CURRENT already publishes nothing). A manifest row may name several photos of a product
    (``paths``: a list) and text fields; with --text-fields the version is searched hybrid (photos, text
    embeddings and BM25, fused as calibrated on the catalogue itself)."""
    from indexer.build import build

    settings = _settings(
        text_fields=text_fields,
        index_root=index_root,
        rerank_dtype=rerank_dtype,
        index_workers=workers,
        threads=threads,
        index_batch_size=batch_size,
        index_shards=shards,
        engine=engine,
        ray_address=address,
    )
    with _errors(), _progress("encoding") as progress:
        report = build(
            name,
            sources,
            settings=settings,
            model_dir=model,
            index_factory=index_factory,
            progress=progress,
            force=force,
            gate=gate_from_context(ctx.obj),
            synonyms=synonyms,
        )
    _summary(report, json_report)
    if report.gate is not None and not report.published:
        raise typer.Exit(code=1)  # refused by the quality gate (the notes say why)


@index_app.command("add")
def add_command(
    ctx: typer.Context,
    name: Name,
    sources: Sources,
    model: ModelDir = None,
    index_root: IndexRoot = None,
    workers: Workers = None,
    threads: Threads = None,
    batch_size: BatchSize = None,
    json_report: ReportOut = None,
    engine: Engine = None,
    address: Address = None,
) -> None:
    """Add the sources' new items (ids not in the index yet) as a new version; others are kept as is."""
    from indexer.build import add

    settings = _settings(
        index_root=index_root,
        index_workers=workers,
        threads=threads,
        index_batch_size=batch_size,
        engine=engine,
        ray_address=address,
    )
    with _errors(), _progress("encoding new items") as progress:
        report = add(
            name,
            sources,
            settings=settings,
            model_dir=model,
            progress=progress,
            gate=gate_from_context(ctx.obj),
        )
    _summary(report, json_report)
    if report.gate is not None and not report.published:
        raise typer.Exit(code=1)  # refused by the quality gate (the notes say why)


@index_app.command("delete")
def delete_command(
    name: Name,
    ids: Annotated[list[str], typer.Argument(help="Item ids to remove.")],
    index_root: IndexRoot = None,
) -> None:
    """Remove items (gone from results at once; compacted at the next full build)."""
    from indexer.build import delete

    with _errors():
        report = delete(name, ids, settings=_settings(index_root=index_root))
    _summary(report, None)


@index_app.command("compact")
def compact_command(name: Name, index_root: IndexRoot = None, json_report: ReportOut = None) -> None:
    """Fold the product writes of the index's change log (the API's PUT, PATCH and DELETE) into a new
    version, published, and drop them from the log; the answers stay the same. Upserted products are encoded
    by a build of the catalogue (CURRENT's photos read at their paths, its vectors reused). Nothing
    pending: nothing published."""
    from indexer.live_compact import compact

    with _errors():
        report = compact(name, settings=_settings(index_root=index_root))
    if report.published:
        _summary(report, json_report)
        return
    for note in report.notes:
        console.print(f"{name}: {escape(note)}", highlight=False)


@index_app.command("log")
def log_command(
    name: Name,
    index_root: IndexRoot = None,
    last: Annotated[int, typer.Option(min=0, max=1000, help="Show this many of the newest entries.")] = 10,
) -> None:
    """The index's change log: its sequence numbers, what CURRENT holds, what is pending (no version holds
    it yet), and the newest entries."""
    from indexer.live_fold import open_log

    settings = _settings(index_root=index_root)
    root = settings.index_root
    with _errors():
        current = versions.current_version(root, name)
        held = IndexManifest.load(root / name / current / MANIFEST_FILE).live_sequence if current else 0
        opened = open_log(root, name, settings.live_dsn)
        if opened is None:
            console.print(f"{name}: no change log (nothing was written through the API)", highlight=False)
            return
        with opened:
            last_seq, folded = opened.last_sequence(), opened.folded_sequence()
            pending = opened.pending(held)
            newest = opened.changes_since(max(held, last_seq - last), limit=max(1, last)) if last else []
    console.print(
        f"{name}: {opened.where}; last sequence {last_seq}, folded up to {folded}, "
        f"CURRENT ({current or '-'}) holds up to {held}; {pending} pending",
        highlight=False,
        soft_wrap=True,
    )
    if newest:
        table = Table(title="newest entries")
        for col in ("seq", "committed", "kind", "id", "change"):
            table.add_column(col)
        for entry in newest:
            change = entry.change
            body = {k: v for k, v in vars(change).items() if k != "id" and v}
            stamp = datetime.fromtimestamp(entry.committed_at, UTC).isoformat(timespec="seconds")
            table.add_row(str(entry.seq), stamp, change.kind, change.id, json.dumps(body, default=str)[:80])
        console.print(table)


@index_app.command("rollback")
def rollback_command(
    name: Name,
    to: Annotated[
        str | None,
        typer.Option(help="Version to publish (default: the newest before CURRENT not refused by the gate)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Publish --to even if the quality gate refused it.")
    ] = False,
    index_root: IndexRoot = None,
) -> None:
    """Publish an earlier kept version (never one the quality gate refused, unless --to it with --force)."""
    from indexer.build import rollback

    with _errors():
        report = rollback(name, settings=_settings(index_root=index_root), to=to, force=force)
    console.print(f"{name}: CURRENT is now {report.version} ({escape(report.notes[0])})", highlight=False)
    for note in report.notes[1:]:
        err_console.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False, soft_wrap=True)


@index_app.command("list")
def list_command(name: Name, index_root: IndexRoot = None) -> None:
    """The kept versions, oldest first; * marks CURRENT, the status column CURRENT and gate-refused ones."""
    root = _settings(index_root=index_root).index_root
    with _errors():
        kept = versions.list_versions(root, name)
        if not kept:
            raise IndexNotFoundError(f"index {name!r} has no versions under {root}")
        current = versions.current_version(root, name)
        table = Table(title=f"{root / name}")
        columns = ("version", "status", "created", "items", "index", "params", "recall@10", "model", "parent")
        for col in ("", *columns):
            table.add_column(col, no_wrap=col in ("version", "items", "status"))
        for v in kept:
            status = ["CURRENT"] if v == current else []
            try:
                m = IndexManifest.load(root / name / v / MANIFEST_FILE)
            except IndexFormatError as exc:  # one broken version must not hide the others
                table.add_row("*" if status else "", v, ", ".join([*status, "unreadable"]), str(exc))
                continue
            if versions.refused_by_gate(m):
                status.append("refused by gate")
            shards = m.sharding.get("shards", [])
            table.add_row(
                "*" if v == current else "",
                v,
                ", ".join(status) or "-",
                m.created_at,
                f"{m.count:,}",
                (f"{len(shards)} shards: " if shards else "") + m.index_factory,
                json.dumps([s.get("search_params", {}) for s in shards] if shards else m.search_params),
                "-" if m.measured_recall_at_10 is None else f"{m.measured_recall_at_10:.3f}",
                m.model_name,
                m.parent_version or "-",
            )
    console.print(table)


@index_app.command("verify")
def verify_command(
    name: Name,
    version: Annotated[str | None, typer.Option(help="Version to check (default: CURRENT).")] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            help="Also check compatibility with this model (default: settings.model_dir, when it is the "
            "model the manifest names)",
        ),
    ] = None,
    index_root: IndexRoot = None,
) -> None:
    """Check checksums, counts and model compatibility; exit code 1 when a problem is found."""
    settings = _settings(index_root=index_root)
    with _errors():
        chosen = version or versions.current_version(settings.index_root, name)
        against, note = model_to_verify(settings.index_root, name, chosen, model, settings.model_dir)
        problems = verify_version(settings.index_root, name, chosen, model_dir=against)
    if problems:
        for p in problems:
            err_console.print(f"[red]problem:[/red] {escape(str(p))}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=1)
    checked = "checksums, counts, model" if against is not None else "checksums, counts"
    console.print(f"{name}/{chosen}: OK ({checked})", highlight=False)
    if note is not None:
        console.print(note, highlight=False, markup=False, soft_wrap=True)
