"""The reader board (``store.live.readers``), on SQLite and the real PostgreSQL server: who is behind a
sequence, the fresh only; a reader that leaves is not waited for; two handles (two processes) see one
board; a forked child reports as itself."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from store.live.readers import PostgresReaderBoard, ReaderBoard, SqliteReaderBoard
from tests.store.live.logs import PG_DSN

MakeBoard = Callable[[], ReaderBoard]


@pytest.fixture(params=["sqlite", "postgres"])
def make_board(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeBoard]:
    opened: list[ReaderBoard] = []
    index = f"readers-{uuid.uuid4().hex[:8]}"

    def make() -> ReaderBoard:
        board: ReaderBoard
        if request.param == "sqlite":
            board = SqliteReaderBoard(tmp_path / "live-readers.sqlite")
        else:
            board = PostgresReaderBoard(PG_DSN, index, "ccrk_live")
        opened.append(board)
        return board

    yield make
    if request.param == "postgres":
        import psycopg

        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute("DELETE FROM ccrk_live.readers WHERE index_name = %s", (index,))
    for board in opened:
        board.close()


def test_the_fresh_readers_behind_a_sequence(make_board: MakeBoard) -> None:
    a, b = make_board(), make_board()  # two processes' handles on one board
    assert a.behind(1) == {}
    a.report("host:1", 5)
    b.report("host:2", 9)
    assert b.behind(6) == {"host:1": 5} and a.behind(10) == {"host:1": 5, "host:2": 9}
    assert a.behind(5) == {}
    a.report("host:1", 12)  # moved on
    assert b.behind(10) == {"host:2": 9}
    time.sleep(0.3)
    b.report("host:2", 9)  # heard again; host:1 silent for 0.3 s
    assert a.behind(20, fresh_s=0.2) == {"host:2": 9}
    b.leave("host:2")
    assert a.behind(20) == {"host:1": 12}
    a.report("host:1", 12, wake="ccrk-live-abc")  # with its wake-up socket's name
    assert b.laggards(13) == {"host:1": (12, "ccrk-live-abc")}


def test_a_forked_child_reports_on_a_connection_of_its_own(make_board: MakeBoard) -> None:
    board = make_board()
    board.report("parent", 1)
    pid = os.fork()
    if pid == 0:  # the child: its own connection, then gone without closing anything of the parent's
        code = 1
        try:
            board.report("child", 3)
            code = 0 if board.behind(4) == {"parent": 1, "child": 3} else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    board.report("parent", 4)  # the parent's connection still serves
    assert board.behind(5) == {"parent": 4, "child": 3}
