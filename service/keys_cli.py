"""``ccrk keys``: create, list, revoke and rotate the API keys of an index root (``service.keys``).

A new or rotated key is printed once, as the command's last line; only its SHA-256 is stored."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

keys_app = typer.Typer(
    help="API keys with scopes (search, write, events, admin), per-index access and fair-share limits.",
    no_args_is_help=True,
)

IndexRoot = Annotated[
    Path | None,
    typer.Option(
        help="Root of all indexes: its api-keys.json (default: settings.keys_file, else"
        " settings.index_root's)."
    ),
]
RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*s)?\s*$")
QUOTA = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*(?:/\s*day)?\s*$", re.IGNORECASE)


def _root(index_root: Path | None) -> Path:
    """The index root given, else the keys file of the settings."""
    if index_root is not None:
        return index_root
    from ccrk_settings import SettingsError, settings_with

    try:
        settings = settings_with({})
    except SettingsError as exc:
        raise typer.BadParameter(exc.describe()) from None
    return settings.keys_file or settings.index_root


def _rate(text: str | None) -> float | None:
    if text is None:
        return None
    match = RATE.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise typer.BadParameter(f"--rate must read like 50/s (requests per second above 0), got {text!r}")
    return float(match.group(1))


def _quota(text: str | None) -> int | None:
    if text is None:
        return None
    match = QUOTA.match(text)
    if match is None or float(match.group(1)) < 1 or float(match.group(1)) != int(float(match.group(1))):
        raise typer.BadParameter(f"--quota must read like 1e6/day (a whole number of requests), got {text!r}")
    return int(float(match.group(1)))


def _fail(exc: Exception) -> typer.Exit:
    typer.echo(f"Error: {exc}", err=True)
    return typer.Exit(2)


def _describe(record: object) -> str:
    from service.keys import KeyRecord

    assert isinstance(record, KeyRecord)
    limits = f"rate {record.rate:g}/s" if record.rate is not None else "rate default"
    if record.burst is not None:
        limits += f" burst {record.burst}"
    if record.quota_per_day is not None:
        limits += f" quota {record.quota_per_day}/day"
    return (
        f"{record.id}  {record.scope:<6}  indexes {','.join(record.indexes)}  {limits}  "
        f"created {record.created_at}" + (f"  {record.name}" if record.name else "")
    )


@keys_app.command("create")
def create_command(
    scope: Annotated[
        str,
        typer.Option(
            help="search; write (product writes, and search); events (shoppers' clicks, and search); "
            "admin (admin routes, writes, events, search)."
        ),
    ] = "search",
    index: Annotated[
        list[str] | None, typer.Option("--index", help="An index the key may search (repeat); default: all.")
    ] = None,
    rate: Annotated[str | None, typer.Option(help="Requests per second, e.g. 50/s (default: key_rate).")] = (
        None
    ),
    burst: Annotated[int | None, typer.Option(min=1, help="Bucket size (default: one second's rate).")] = (
        None
    ),
    quota: Annotated[str | None, typer.Option(help="Requests per UTC day, e.g. 1e6/day.")] = None,
    name: Annotated[str, typer.Option(help="A label (who holds the key).")] = "",
    index_root: IndexRoot = None,
) -> None:
    """A new key; printed once, as the last line (store it now: only its hash is kept)."""
    from service.keys import KeyStore, KeyStoreError

    try:
        record, key = KeyStore(_root(index_root)).create(
            scope, list(index or []), rate=_rate(rate), burst=burst, quota_per_day=_quota(quota), name=name
        )
    except (KeyStoreError, OSError) as exc:
        raise _fail(exc) from None
    typer.echo(_describe(record))
    typer.echo(key)


@keys_app.command("list")
def list_command(index_root: IndexRoot = None) -> None:
    """Every key's id, scope, indexes and limits (never the key)."""
    from service.keys import KeyStore, KeyStoreError

    try:
        records = KeyStore(_root(index_root)).records()
    except (KeyStoreError, OSError) as exc:
        raise _fail(exc) from None
    for record in records:
        typer.echo(_describe(record))
    if not records:
        typer.echo("no API keys")


@keys_app.command("revoke")
def revoke_command(
    id_or_key: Annotated[str, typer.Argument(help="The key's id (ccrk keys list), or the key itself.")],
    index_root: IndexRoot = None,
) -> None:
    """Remove a key; every server process refuses it within a second."""
    from service.keys import KeyStore, KeyStoreError

    try:
        record = KeyStore(_root(index_root)).revoke(id_or_key)
    except (KeyStoreError, OSError) as exc:
        raise _fail(exc) from None
    typer.echo(f"revoked {record.id}")


@keys_app.command("rotate")
def rotate_command(
    id_or_key: Annotated[str, typer.Argument(help="The key's id, or the key itself.")],
    index_root: IndexRoot = None,
) -> None:
    """A new secret for a key (same id, scope, indexes and limits); the old key stops working. The new key
    is printed once, as the last line."""
    from service.keys import KeyStore, KeyStoreError

    try:
        record, key = KeyStore(_root(index_root)).rotate(id_or_key)
    except (KeyStoreError, OSError) as exc:
        raise _fail(exc) from None
    typer.echo(_describe(record))
    typer.echo(key)
