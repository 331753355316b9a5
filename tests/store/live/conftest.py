"""Fixtures of the change log's tests: one log per test on either backend (``make_log``), the
PostgreSQL one on the real server (``CCRK_TEST_PG_DSN``, default 127.0.0.1:5432, database ``test``) in a
schema of its own, dropped after; skipped with the reason when the server does not answer."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.live import ChangeLog, SqliteChangeLog
from tests.store.live.logs import PG_DSN, MakeLog


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh schema name on the real server, dropped with everything in it after the test."""
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed")
    try:
        admin = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=2)
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL does not answer at {PG_DSN}: {exc}")
    schema = f"t_live_{uuid.uuid4().hex[:16]}"
    try:
        yield schema
    finally:
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.close()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_log(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[MakeLog]:
    opened: list[ChangeLog] = []
    if backend == "postgres":
        from store.live.postgres import PostgresChangeLog

        schema = request.getfixturevalue("pg_schema")

        def make() -> ChangeLog:
            opened.append(PostgresChangeLog(PG_DSN, "shop", schema=schema))
            return opened[-1]
    else:

        def make() -> ChangeLog:
            opened.append(SqliteChangeLog(tmp_path / "changes.sqlite", busy_timeout_s=10.0))
            return opened[-1]

    yield make
    for log in opened:
        log.close()


@pytest.fixture
def log(make_log: MakeLog) -> ChangeLog:
    return make_log()
