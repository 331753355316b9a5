"""`ccrk serve --workers 2`: two real uvicorn processes on one port. Both answer and search the same index;
a second group on the same port is refused; /metrics sums both, whichever answers the scrape; only one
runs the probes; both store their traffic; a new CURRENT is picked up by both; a killed process is
replaced; SIGTERM stops everything and removes the shared worker folder."""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from monitoring.history import SqliteHistory
from monitoring.probe_set import probes_from_captions, save_probe_set
from service.workers import ConnectionSlots
from tests.fixtures import Catalogue, write_version
from tests.service.conftest import free_port

SEARCHES = 24


def wait_for(fetch: Callable[[], Any], ok: Callable[[Any], bool], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = fetch()
        except httpx.HTTPError as exc:
            value = exc
        if not isinstance(value, Exception) and ok(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: last {value!r}")
        time.sleep(0.1)


def children(pid: int) -> set[int]:
    return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may wait for a reaper that never comes)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def fresh_get(url: str) -> httpx.Response:
    """A request on a new connection (the kernel hands each new connection to either process)."""
    return httpx.get(url, timeout=10)


def search_count(metrics_text: str) -> float:
    pattern = r'^ccrk_request_seconds_count\{[^}]*route="/v1/search"[^}]*status="2xx"[^}]*\} (\S+)$'
    return sum(float(m) for m in re.findall(pattern, metrics_text, flags=re.MULTILINE))


@dataclass
class Group:
    proc: subprocess.Popen[bytes]
    url: str
    root: Path
    db: Path
    command: list[str]
    env: dict[str, str]


@pytest.fixture()
def group(catalogue: Catalogue, tmp_path: Path) -> Iterator[Group]:
    root = tmp_path / "indexes"
    write_version(root, catalogue, rows=list(range(40)))
    probes = tmp_path / "probes.jsonl"
    save_probe_set(
        probes_from_captions([(r.id, r.captions) for r in catalogue.records[:40]], n=6, seed=1), probes
    )
    db = tmp_path / "history.sqlite"
    tmp = tmp_path / "tmp"  # where `ccrk serve` makes the worker folder
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")}
    env.update(
        {
            "TMPDIR": str(tmp),
            "CCRK_THREADS": "1",
            "CCRK_SEARCH_WORKERS": "1",
            "CCRK_RERANK": "false",
            "CCRK_INDEX_POLL_S": "0.2",
            "CCRK_PROBE_SET": str(probes),
            "CCRK_PROBE_INTERVAL_MIN": "0",
            "CCRK_PROBE_PAUSE_S": "0",
            "CCRK_PROBE_DEPTH": "20",
            "CCRK_HISTORY_DB": str(db),
            "CCRK_TRAFFIC_FLUSH_S": "0.2",
            "CCRK_ANN_SAMPLE_RATE": "0",
            "CCRK_ADMIN_API_KEY": "test-admin-key",
        }
    )
    port = free_port()
    ccrk = Path(sys.executable).parent / "ccrk"
    command = [str(ccrk), "serve", "--workers", "2", "--port", str(port), "--index-root", str(root)]
    command += ["--index-name", "shop", "--log-level", "warning"]
    proc = subprocess.Popen(command, env=env)
    try:
        yield Group(proc, f"http://127.0.0.1:{port}", root, db, command, env)
    finally:
        if proc.poll() is None:
            kids = children(proc.pid)
            proc.kill()  # the processes notice and stop by themselves
            proc.wait(timeout=30)
            wait_for(lambda: [k for k in kids if running(k)], lambda alive: not alive, "orphans to stop")


def test_two_processes_share_port_metrics_probes_and_swaps(catalogue: Catalogue, group: Group) -> None:
    proc, url, root, db = group.proc, group.url, group.root, group.db
    wait_for(lambda: fresh_get(f"{url}/readyz"), lambda r: r.status_code == 200, "readiness", timeout=180)

    # Both processes answer (new connections land on either), and they are the server's children.
    pids: set[int] = set()
    for _ in range(400):
        pids.add(fresh_get(f"{url}/healthz").json()["pid"])
        if len(pids) == 2:
            break
    assert len(pids) == 2 and pids <= children(proc.pid)  # (another child: multiprocessing's tracker)

    # A second group on the same port is refused.
    second_group = subprocess.run(group.command, env=group.env, capture_output=True, timeout=120)
    assert second_group.returncode == 1
    assert f"cannot listen on 127.0.0.1:{url.rsplit(':', 1)[1]}" in second_group.stderr.decode()
    wait_for(
        lambda: {fresh_get(f"{url}/readyz").json()["index_version"] for _ in range(20)},
        lambda versions: len(versions) == 1,
        "both processes serving the version",
    )

    for n in range(SEARCHES):
        record = catalogue.records[n]
        lang = ("de", "ja", "fr")[n % 3]
        response = httpx.post(
            f"{url}/v1/search", json={"query": record.captions[lang][0], "lang": lang, "top_k": 5}, timeout=10
        )
        assert response.status_code == 200, response.text
        assert record.id in [hit["id"] for hit in response.json()["results"]]

    # A version override would reach one process only: refused, CURRENT reloads are fine.
    key = {"x-api-key": "test-admin-key"}
    served = fresh_get(f"{url}/readyz").json()["index_version"]
    override = httpx.post(f"{url}/v1/admin/reload", headers=key, params={"version": served}, timeout=30)
    assert override.status_code == 409 and override.json()["detail"][0]["loc"] == ["query", "version"]
    assert httpx.post(f"{url}/v1/admin/reload", headers=key, timeout=30).status_code == 200

    # Every scrape, whichever process answers, counts the searches of both.
    for _ in range(8):
        text = fresh_get(f"{url}/metrics").text
        assert search_count(text) == SEARCHES
        assert "ccrk_index_items 40.0" in text

    store = SqliteHistory(db, 86400.0)
    try:
        runs = wait_for(lambda: store.runs(0), lambda r: len(r) >= 1, "the startup probe")
        wait_for(
            lambda: sum(b.count for b in store.traffic(0)),
            lambda n: n == SEARCHES,
            "the traffic of both processes stored",
        )
        time.sleep(1.0)  # time enough for a second process to probe, were it to
        runs = store.runs(0)
        assert [r["source"] for r in runs] == ["startup"]

        # A new CURRENT: both processes swap; one probe of the new version.
        second = write_version(root, catalogue)
        wait_for(
            lambda: {fresh_get(f"{url}/readyz").json()["index_version"] for _ in range(20)},
            lambda versions: versions == {second},
            "both processes on the new version",
        )
        wait_for(lambda: store.runs(0), lambda r: len(r) >= 2, "the swap probe")
        time.sleep(1.0)
        runs = store.runs(0)
        assert [(r["source"], r["index_version"]) for r in runs][1:] == [("swap", second)]
        text = fresh_get(f"{url}/metrics").text
        assert f'ccrk_index_info{{name="shop",version="{second}"}} 1.0' in text
        assert "ccrk_index_items 60.0" in text
    finally:
        store.close()

    # A process that dies is replaced; the other keeps answering meanwhile.
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    assert fresh_get(f"{url}/readyz").status_code == 200
    wait_for(
        lambda: {fresh_get(f"{url}/healthz").json()["pid"] for _ in range(30)},
        lambda answered: len(answered) == 2 and victim not in answered,
        "a new process in place of the killed one",
    )
    # The killed process's gauges went with it: after the next version, only that one counts as served.
    third = write_version(root, catalogue, rows=list(range(50)))
    wait_for(
        lambda: {fresh_get(f"{url}/readyz").json()["index_version"] for _ in range(20)},
        lambda versions: versions == {third},
        "both processes on the third version",
    )
    text = fresh_get(f"{url}/metrics").text
    assert f'ccrk_index_info{{name="shop",version="{third}"}} 1.0' in text
    assert f'ccrk_index_info{{name="shop",version="{second}"}} 0.0' in text
    assert "ccrk_index_items 50.0" in text

    proc.terminate()
    assert proc.wait(timeout=60) == 0
    assert not list((db.parent / "tmp").glob("ccrk-workers-*")), "the worker folder was left behind"


def test_a_process_failing_at_startup_stops_the_group(tmp_path: Path, index_root: Path) -> None:
    """Every process fails at startup (a CUDA device asked of an ONNX Runtime without CUDA): it would fail
    again, so the group exits, non-zero. A model folder without a model never gets that far: the model
    check refuses it before any process starts (exit 2, naming the file)."""
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: the processes would start")
    (tmp_path / "empty-model").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")} | {"TMPDIR": str(tmp_path)}
    ccrk = Path(sys.executable).parent / "ccrk"
    command = [str(ccrk), "serve", "--workers", "2", "--port", str(free_port()), "--log-level", "warning"]
    refused = subprocess.run(
        [*command, "--index-root", str(tmp_path), "--model", str(tmp_path / "empty-model")],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert refused.returncode == 2
    assert f"{tmp_path / 'empty-model' / 'config.json'}: not found" in refused.stderr.decode()
    done = subprocess.run(
        [*command, "--index-root", str(index_root), "--index-name", "shop"],
        env=env | {"CCRK_DEVICE": "cuda"},
        capture_output=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "failed to start" in done.stderr.decode()
    assert not list(tmp_path.glob("ccrk-workers-*"))


def test_processes_stop_when_the_supervisor_is_killed(group: Group) -> None:
    """SIGKILL leaves the supervisor no chance to stop its processes: they notice and stop by themselves
    (else they would keep serving and holding the port)."""
    ready = f"{group.url}/readyz"
    wait_for(lambda: fresh_get(ready), lambda r: r.status_code == 200, "readiness", timeout=180)
    kids = children(group.proc.pid)
    assert len([k for k in kids if running(k)]) >= 2
    group.proc.kill()
    group.proc.wait(timeout=30)
    wait_for(lambda: [k for k in kids if running(k)], lambda alive: not alive, "the processes to stop")
    with pytest.raises(httpx.ConnectError):
        fresh_get(f"{group.url}/healthz")


def test_connection_slots_ignore_processes_not_serving() -> None:
    counts = multiprocessing.get_context("spawn").RawArray("q", [-1, -1, -1])
    first, second = ConnectionSlots(counts, 0), ConnectionSlots(counts, 1)
    assert first.fewest_elsewhere() is None  # nobody else serves: accept everything
    first.publish(3)
    second.publish(5)
    assert first.fewest_elsewhere() == 5
    assert second.fewest_elsewhere() == 3
    ConnectionSlots(counts, 2).publish(1)
    assert first.fewest_elsewhere() == 1 and second.fewest_elsewhere() == 1
    second.publish(-1)  # stopped serving
    assert first.fewest_elsewhere() == 1
    assert list(counts) == [3, -1, 1]


def connection_pids(url: str, n: int, *, at_once: bool) -> tuple[list[int], list[http.client.HTTPConnection]]:
    """The process answering on each of ``n`` keep-alive connections; ``at_once``: all connected before
    the first request (the server finds them queued together)."""
    host, port = url.removeprefix("http://").split(":")
    conns = [http.client.HTTPConnection(host, int(port), timeout=30) for _ in range(n)]
    if at_once:
        for conn in conns:
            conn.connect()
    pids = []
    for conn in conns:
        conn.request("GET", "/healthz")
        pids.append(json.loads(conn.getresponse().read())["pid"])
    return pids, conns


def close_all(conns: list[http.client.HTTPConnection]) -> None:
    for conn in conns:
        conn.close()


def test_connections_spread_evenly_and_around_a_stuck_process(group: Group) -> None:
    """Keep-alive connections are split evenly over the processes, whether they arrive one by one or all at
    once (the kernel's hashing gave 23/9 splits of 32); a stopped process's share is taken by the other."""
    wait_for(
        lambda: fresh_get(f"{group.url}/readyz"), lambda r: r.status_code == 200, "readiness", timeout=180
    )
    kids = sorted(k for k in children(group.proc.pid) if running(k))
    serving: set[int] = set()
    wait_for(
        lambda: serving.update(connection_pids(group.url, 1, at_once=False)[0]) or serving,
        lambda seen: len(seen) == 2,
        "both processes serving",
        timeout=180,
    )
    for at_once in (False, True):
        pids, conns = connection_pids(group.url, 32, at_once=at_once)
        counts = sorted(Counter(pids).values())
        assert len(counts) == 2 and counts[0] >= 15, (at_once, Counter(pids))
        close_all(conns)
    time.sleep(0.5)  # the closes are counted

    stuck, other = sorted(serving)
    os.kill(stuck, signal.SIGSTOP)
    try:
        start = time.monotonic()
        pids, conns = connection_pids(group.url, 6, at_once=False)
        assert set(pids) == {other}
        assert time.monotonic() - start < 5.0
    finally:
        os.kill(stuck, signal.SIGCONT)
    # Back, it is the least loaded: new connections go there first.
    more, more_conns = connection_pids(group.url, 6, at_once=False)
    assert Counter(more)[stuck] >= 3, Counter(more)
    close_all(conns + more_conns)
    assert set(kids) >= serving
