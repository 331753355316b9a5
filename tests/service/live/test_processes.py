"""Product writes across real processes: ``ccrk serve --workers 2`` shows a price change in the other
worker when the write answers (wait), and on its own (no wait); ``kill -9`` of every process while writes
stream in, then a restart: every acknowledged write is there; two separate ``ccrk serve`` processes (two
pods) on one PostgreSQL log see each other's writes when they answer, and without wait are woken by its
NOTIFY long before their poll. (How soon without wait, p50 and p99, is ``bench/live_updates.py``'s to
measure: no timed assertion here beyond such bounds.)"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from store.live import SqliteChangeLog, changelog_path
from tests.service.conftest import free_port
from tests.service.live.shop import BY_PRICE, EVERY, build_shop
from tests.service.test_workers import children, running, wait_for
from tests.store.live.logs import PG_DSN

ADMIN = "test-admin-key"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("live-processes")
    return build_shop(tmp, "shop").index_root


@dataclass
class Serve:
    """``ccrk serve`` in processes of its own (killed, and its workers waited for, at the end)."""

    root: Path
    args: list[str]
    env_extra: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def start(self) -> Serve:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")}
        env.update(
            {
                "CCRK_THREADS": "1",
                "CCRK_SEARCH_WORKERS": "1",
                "CCRK_RERANK": "false",
                "CCRK_ADMIN_API_KEY": ADMIN,
                "CCRK_ANN_SAMPLE_RATE": "0",
                "CCRK_HISTORY_DB": str(self.root.parent / f"history-{self.port}.sqlite"),
                "CCRK_AUTH_FAILURES_PER_MINUTE": "100000",
                **self.env_extra,
            }
        )
        ccrk = Path(sys.executable).parent / "ccrk"
        command = [str(ccrk), "serve", "--port", str(self.port), "--index-root", str(self.root), *self.args]
        self.proc = subprocess.Popen([*command, "--log-level", "warning"], env=env)
        wait_for(self._ready, bool, "the server to be ready", timeout=90)
        return self

    def _ready(self) -> bool:
        try:
            return request(self.connect(), "GET", "/readyz")[0] == 200
        except OSError:
            return False

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(*self.address, timeout=30)

    def kill(self) -> None:
        """SIGKILL the supervisor and every worker at once (nothing may finish or flush)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        kids = children(self.proc.pid)
        for pid in (self.proc.pid, *kids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        wait_for(lambda: [k for k in kids if running(k)], lambda alive: not alive, "the workers to die")


def request(conn: http.client.HTTPConnection, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    headers = {"X-API-Key": ADMIN, "Content-Type": "application/json"}
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    answer = conn.getresponse()
    data = answer.read()
    return answer.status, json.loads(data) if data else None


def per_process(serve: Serve, want: int = 2) -> dict[int, http.client.HTTPConnection]:
    """A keep-alive connection to each of the group's processes (the kernel spreads new connections)."""
    found: dict[int, http.client.HTTPConnection] = {}
    deadline = time.monotonic() + 60  # the second process may still be loading
    while time.monotonic() < deadline:
        conn = serve.connect()
        try:
            status, _ = request(conn, "GET", "/readyz")
            pid = request(conn, "GET", "/healthz")[1]["pid"]
        except OSError:
            continue
        if status != 200 or pid in found:
            conn.close()
            time.sleep(0.05)
        else:
            found[pid] = conn
        if len(found) == want:
            return found
    raise AssertionError(f"reached {len(found)} of {want} processes")


def first_by_price(conn: http.client.HTTPConnection) -> str:
    status, body = request(conn, "POST", "/v1/search", BY_PRICE)
    assert status == 200, body
    return body["results"][0]["id"]


def visible_within(conn: http.client.HTTPConnection, check: Any, timeout: float = 5.0) -> float:
    start = time.monotonic()
    while not check(conn):
        assert time.monotonic() - start < timeout, "not visible in time"
        time.sleep(0.01)
    return time.monotonic() - start


@pytest.fixture()
def group(built: Path) -> Iterator[Serve]:
    serve = Serve(built, ["--workers", "2", "--index-name", "shop"])
    try:
        yield serve.start()
    finally:
        serve.kill()


def test_a_price_change_shows_in_both_workers_within_a_second(group: Serve) -> None:
    (pid_a, a), (_, b) = per_process(group).items()
    status, body = request(a, "POST", "/v1/search", BY_PRICE)
    dearest = body["results"][-1]["id"]
    assert first_by_price(b) != dearest
    status, receipt = request(a, "PATCH", f"/v1/products/{dearest}", {"fields": {"price": 0.001}})
    assert status == 200 and receipt["visible"], receipt
    # wait=true (the default) answered once both workers showed it: the other one too, at once.
    assert first_by_price(a) == dearest
    assert first_by_price(b) == dearest
    # Without wait, the other worker shows it on its own (its poll): how soon is bench/live_updates.py's.
    status, body = request(a, "POST", "/v1/search", BY_PRICE)
    dearest = body["results"][-1]["id"]
    status, receipt = request(a, "PATCH", f"/v1/products/{dearest}?wait=false", {"fields": {"price": 0.0001}})
    assert status == 200 and not receipt["visible"], receipt
    visible_within(b, lambda conn: first_by_price(conn) == dearest)
    assert request(a, "GET", "/healthz")[1]["pid"] == pid_a  # the same keep-alive process throughout


def test_every_acknowledged_write_survives_kill_9_of_every_process(built: Path) -> None:
    serve = Serve(built, ["--workers", "2", "--index-name", "shop"]).start()
    acked: list[tuple[int, str, int]] = []  # (seq, product, rev) of every answered write
    stop = threading.Event()

    def writer() -> None:
        conn = serve.connect()
        rev = 0
        while not stop.is_set():
            rev += 1
            product = f"prod-{rev % 30}"
            try:
                # wait=false: acknowledged once logged, as with wait (durability is the same), without
                # waiting for the other worker's poll, so 500 writes come quickly.
                status, receipt = request(
                    conn, "PATCH", f"/v1/products/{product}?wait=false", {"fields": {"rev": rev}}
                )
            except (OSError, http.client.HTTPException):
                return  # the server died under this write: not acknowledged
            assert status == 200, receipt
            acked.append((receipt["seq"], product, rev))

    thread = threading.Thread(target=writer, daemon=True)
    try:
        thread.start()
        wait_for(lambda: len(acked), lambda n: n >= 500, "500 acknowledged writes", timeout=120)
        serve.kill()  # whatever write is in flight now
    finally:
        stop.set()
        serve.kill()
        thread.join(timeout=30)
    assert len(acked) >= 500
    with SqliteChangeLog(changelog_path(built, "shop")) as log:
        stored = {e.seq: e.change for e in log.iter_changes(0)}
    for seq, product, rev in acked:
        change = stored[seq]
        assert change.id == product and dict(change.fields) == {"rev": rev}  # type: ignore[union-attr]
    last = {product: rev for _, product, rev in sorted(acked)}
    again = Serve(built, ["--index-name", "shop"]).start()
    try:
        status, body = request(again.connect(), "POST", "/v1/search", EVERY)
        assert status == 200, body
        shown = {hit["id"]: hit["metadata"].get("rev") for hit in body["results"]}
        for product, rev in last.items():
            assert shown[product] >= rev  # the last acknowledged write, or one in flight after it
            assert shown[product] - rev <= 30  # at most the one write in flight
    finally:
        again.kill()


@pytest.fixture()
def pg_index(built: Path, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A copy of the shop under a name of its own (one log per test in the shared schema), its PostgreSQL
    rows removed after."""
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed")
    try:
        psycopg.connect(PG_DSN, connect_timeout=2).close()
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL does not answer at {PG_DSN}: {exc}")
    name = f"pods{uuid.uuid4().hex[:8]}"
    root = tmp_path / "indexes"
    subprocess.run(["cp", "-a", str(built), str(root)], check=True)
    (root / "shop").rename(root / name)
    changelog_path(root, name).unlink(missing_ok=True)  # the other tests' writes, in the copied folder
    for side in ("-wal", "-shm"):
        Path(f"{changelog_path(root, name)}{side}").unlink(missing_ok=True)
    manifest = next((root / name).glob("*/manifest.json"))
    data = json.loads(manifest.read_text())
    data["name"] = name
    manifest.write_text(json.dumps(data))
    try:
        yield root, name
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute("DELETE FROM ccrk_live.changes WHERE index_name = %s", (name,))
            conn.execute("DELETE FROM ccrk_live.log_state WHERE index_name = %s", (name,))


def test_two_pods_on_one_postgresql_log_see_each_others_writes(pg_index: tuple[Path, str]) -> None:
    root, name = pg_index
    pods = [Serve(root, ["--index-name", name], {"CCRK_LIVE_DSN": PG_DSN}) for _ in range(2)]
    try:
        for pod in pods:
            pod.start()
        a, b = (pod.connect() for pod in pods)
        status, body = request(a, "POST", "/v1/search", BY_PRICE)
        assert status == 200, body
        for writer, reader, price in ((a, b, 0.0002), (b, a, 0.0001)):  # each write the new cheapest
            target = request(writer, "POST", "/v1/search", BY_PRICE)[1]["results"][-1]["id"]
            status, receipt = request(writer, "PATCH", f"/v1/products/{target}", {"fields": {"price": price}})
            assert status == 200 and receipt["visible"], receipt
            assert first_by_price(reader) == target  # wait=true: the other pod shows it when it answers
        assert not changelog_path(root, name).exists()  # the log is PostgreSQL's, not a file
    finally:
        for pod in pods:
            pod.kill()


def test_a_write_without_wait_wakes_the_other_pod_through_notify_not_its_poll(
    pg_index: tuple[Path, str],
) -> None:
    """With the poll at its longest (5 s), the other pod shows a write within 2.5 s. Without NOTIFY it could
    not: the first write of each direction is awaited with no bound near the poll's, so the reader has just
    polled when it shows it, and the second, made at once, would wait most of a period for the next poll.
    No wait: no wake-up socket is involved."""
    root, name = pg_index
    env = {"CCRK_LIVE_DSN": PG_DSN, "CCRK_LIVE_POLL_S": "5"}
    pods = [Serve(root, ["--index-name", name], env) for _ in range(2)]
    try:
        for pod in pods:
            pod.start()
        a, b = (pod.connect() for pod in pods)
        price = 0.001
        for writer, reader in ((a, b), (b, a)):
            for bound in (15.0, 2.5):  # the first: whatever phase the reader's poll is in
                price /= 2  # each write the new cheapest
                target = request(writer, "POST", "/v1/search", BY_PRICE)[1]["results"][-1]["id"]
                status, receipt = request(
                    writer, "PATCH", f"/v1/products/{target}?wait=false", {"fields": {"price": price}}
                )
                assert status == 200 and not receipt["visible"], receipt
                visible_within(reader, lambda conn, want=target: first_by_price(conn) == want, timeout=bound)
        for conn in (a, b):  # each says that it listens
            assert request(conn, "GET", "/readyz")[1]["change_notices"] is None
            conn.request("GET", "/metrics", headers={"X-API-Key": ADMIN})
            exposition = conn.getresponse().read().decode()
            assert "\nccrk_live_notices_listening 1.0\n" in exposition, exposition[-2000:]
    finally:
        for pod in pods:
            pod.kill()
