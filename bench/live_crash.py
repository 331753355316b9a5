"""Crash test of the live catalogue (issue 46): acknowledged writes survive ``kill -9`` of every server
process at random moments, and a restart.

A real ``ccrk serve --workers 2`` on loopback (its own session: the supervisor and both workers) serves a
synthetic version of N products (``live_updates.build_version``). Four client threads write through it,
wait=true, each write naming a mark no other write has:

- 90 %: ``PATCH /v1/products/{id}`` ``{"fields": {"mark": k}}`` of a product no other write touches;
- 10 %: ``PUT /v1/products/crash-{k}`` of a new product with one photo (a 96 x 96 JPEG), a title and
  ``mark: k`` (the writer stores the photo and embeds the product before it answers; each restarted
  process embeds it again from the log and the photo store).

At random moments (uniform between ``--min-gap`` and ``--max-gap`` seconds of writing) every process of
the server gets SIGKILL at once (``killpg``); the clients' writes in flight fail, and each client sends its
write again, the same one (idempotent), until a new server (same index, same log) acknowledges it. This
repeats until ``--writes`` writes were acknowledged (a 200 with its ``seq``). Then one last kill, a
restart, and the count:

- **in the log**: every acknowledged ``seq`` holds the change it acknowledged (its product and mark);
- **served**: every acknowledged mark is found by a hybrid search for the product's title through the
  restarted server, in each of its two processes, with ``filters: {"mark": k}``: the patched product, or
  the new one, alone;
- a write in flight at a kill may have been logged before the kill; sent again, it is logged twice
  with the same value (counted: ``entries`` beyond the acknowledged).

``lost`` (acknowledged, then absent from the log or from a process's answers) must be 0, and no write may
be refused (a 4xx or 5xx). What this cannot show: a kill of the processes leaves the kernel's page cache
whole, so it catches an acknowledgement sent before the commit, not a missing sync (the machine's power
lost); the sync at each commit is SQLite's ``synchronous=FULL``, checked in tests/store/live.

    python bench/live_crash.py --writes 10000 --out bench/results/live-crash-DATE.json

The log is the embedded default (SQLite in WAL mode, a sync at each commit, in the index's folder): the
PostgreSQL log's durability is the database's commit, which killing the API processes does not reach.

Prints JSON and a table; not a test.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import live_updates as lu  # noqa: E402

from store.live import open_changelog  # noqa: E402

UPSERT_SHARE = 0.1
CLIENTS = 4


@dataclass
class Ledger:
    """What the clients sent and what the server acknowledged (shared by the client threads)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    next_mark: int = 0
    acked: dict[int, tuple[int, str, str, str]] = field(default_factory=dict)  # mark -> (seq, op, id, title)
    retried: int = 0  # writes sent again after a kill cut them off (in flight, or sent to a dead server)
    refused: list[tuple[int, Any]] = field(default_factory=list)  # 4xx/5xx answers (must be none)

    def take(self) -> int:
        with self.lock:
            self.next_mark += 1
            return self.next_mark


def serve(root: Path, name: str, port: int, tmp: Path) -> subprocess.Popen[bytes]:
    return lu.serve(root, name, port, tmp, own_session=True)


def kill_all(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL to the server's whole session at once; the number of processes it reached."""
    reached = [proc.pid]
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    if children.exists():
        reached += [int(c) for c in children.read_text().split()]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return len(reached)


def ready(port: int, timeout: float = 180) -> float:
    """Seconds until both processes answer /readyz."""
    t0 = time.monotonic()
    for conn in lu.per_process(port):
        conn.close()
    if time.monotonic() - t0 > timeout:
        raise SystemExit("the server did not come back")
    return time.monotonic() - t0


def client(
    port: int,
    c: int,
    ledger: Ledger,
    ids: np.ndarray,
    titles: list[str],
    title_of: np.ndarray,
    stop: threading.Event,
) -> None:
    """Writes until ``stop``; a connection error (the server killed) is a write in flight: noted, and
    the client waits for the server to come back on a new connection."""
    rng = np.random.default_rng(100 + c)
    conn: lu.Conn | None = None
    while not stop.is_set():
        mark = ledger.take()
        if rng.random() < UPSERT_SHARE:
            op, item = "PUT", f"crash-{mark}"
            photo = base64.b64encode(lu.photo_jpeg(rng)).decode()
            title = titles[int(rng.integers(0, len(titles)))]
            body: dict[str, Any] = {"fields": {"title": title, "mark": mark}, "photos": [{"data": photo}]}
        else:
            product = int(ids[mark % ids.size])
            op, item, title = "PATCH", f"p{product:07d}", titles[int(title_of[product])]
            body = {"fields": {"mark": mark}}
        # Sent again (the same write: idempotent) until acknowledged, as a back office would.
        tries = 0
        while not stop.is_set():
            tries += 1
            try:
                if conn is None:
                    conn = lu.Conn(port)
                status, answer = conn.call(op, f"/v1/products/{item}?wait=true", body)
            except (OSError, http.client.HTTPException):
                status, answer = 0, None
                if conn is not None:
                    conn.close()
                conn = None
            if status == 200:
                with ledger.lock:
                    ledger.acked[mark] = (int(answer["seq"]), op, item, title)
                    if tries > 1:
                        ledger.retried += 1
                break
            if status not in (0, 503):  # 503: a restarting server has no index loaded yet
                with ledger.lock:
                    ledger.refused.append((status, answer))
                break
            time.sleep(0.2)
    if conn is not None:
        conn.close()


def check_log(root: Path, name: str, ledger: Ledger) -> dict[str, Any]:
    """Each acknowledged seq holds the change it acknowledged."""
    log = open_changelog(root, name)
    try:
        by_seq = {}
        for entry in log.iter_changes(0):
            change = entry.change
            fields = getattr(change, "fields", None) or {}
            by_seq[entry.seq] = (change.id, fields.get("mark"))
        last = log.last_sequence()
    finally:
        log.close()
    lost = [mark for mark, (seq, _, item, _) in ledger.acked.items() if by_seq.get(seq) != (item, mark)]
    return {
        "entries": len(by_seq),
        "last_seq": last,
        "acknowledged_missing_or_different": len(lost),
        "first_lost": lost[:5],
        "entries_beyond_acknowledged": len(by_seq) - len(ledger.acked),
    }


def check_served(port: int, ledger: Ledger) -> dict[str, Any]:
    """Every acknowledged mark, searched by a filter on it and the product's title (a hybrid search
    answers the products relevant to its query: the one product the filter leaves must be one), in each of
    the two processes."""
    conns = lu.per_process(port)
    marks = sorted(ledger.acked)
    missing: list[list[int]] = [[] for _ in conns]

    def search(c: int) -> None:
        for mark in marks:
            _, _, item, title = ledger.acked[mark]
            query = {"query": title, "top_k": 3, "mode": "hybrid", "min_score": -1.0}
            status, found = conns[c].call("POST", "/v1/search", query | {"filters": {"mark": mark}})
            if status != 200 or [h["id"] for h in found["results"]] != [item]:
                missing[c].append(mark)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=search, args=(c,)) for c in range(len(conns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    new = [m for m in marks if ledger.acked[m][1] == "PUT"]
    for conn in conns:
        conn.close()
    return {
        "searched_per_process": len(marks),
        "processes": len(conns),
        "missing_per_process": [len(m) for m in missing],
        "first_missing": [m[:5] for m in missing],
        "seconds": round(time.perf_counter() - t0, 1),
        "new_products_acknowledged": len(new),
    }


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    n = max(args.writes * 2, 2000)  # each patch touches a product of its own
    name, build = lu.build_version(args.root, n)
    lu.fresh_log(args.root, name)
    titles, _ = lu.vocabulary()
    ids = np.random.default_rng(3).permutation(n)
    title_of = np.random.default_rng(0).integers(0, len(titles), n)  # build_version's draw, repeated
    ledger = Ledger()
    rng = np.random.default_rng(args.seed)
    proc = serve(args.root, name, args.port, tmp)
    kills: list[dict[str, Any]] = []
    stop = threading.Event()
    first_ready = ready(args.port)
    threads = [
        threading.Thread(target=client, args=(args.port, c, ledger, ids, titles, title_of, stop))
        for c in range(CLIENTS)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    try:
        while len(ledger.acked) < args.writes:
            gap = float(rng.uniform(args.min_gap, args.max_gap))
            deadline = time.monotonic() + gap
            while time.monotonic() < deadline and len(ledger.acked) < args.writes:
                time.sleep(0.01)
            with ledger.lock:
                acked_before = len(ledger.acked)
            reached = kill_all(proc)
            proc = serve(args.root, name, args.port, tmp)
            back = ready(args.port)
            kills.append(
                {
                    "after_s": round(gap, 2),
                    "acked_before": acked_before,
                    "processes": reached,
                    "restart_s": round(back, 1),
                }
            )
            print(f"kill {len(kills)}: {kills[-1]}", file=sys.stderr, flush=True)
        stop.set()
        for t in threads:
            t.join(timeout=120)
        elapsed = time.perf_counter() - t0
        # The last kill: nothing in flight now, so every acknowledged write must come back.
        kills.append({"after_s": 0.0, "acked_before": len(ledger.acked), "processes": kill_all(proc)})
        log_check = check_log(args.root, name, ledger)
        proc = serve(args.root, name, args.port, tmp)
        restart_s = ready(args.port)
        served = check_served(args.port, ledger)
    finally:
        stop.set()
        if proc.poll() is None:
            lu.stop(proc)
    lost = log_check["acknowledged_missing_or_different"] + max(served["missing_per_process"])
    return {
        "products": n,
        "build": build,
        "log": "sqlite",
        "clients": CLIENTS,
        "upsert_share": UPSERT_SHARE,
        "first_ready_s": round(first_ready, 1),
        "acknowledged": len(ledger.acked),
        "retried_after_kills": ledger.retried,
        "refused": len(ledger.refused),
        "first_refused": ledger.refused[:3],
        "writing_seconds": round(elapsed, 1),
        "kills": kills,
        "last_restart_s": round(restart_s, 1),
        "log_check": log_check,
        "served_check": served,
        "lost": lost,
    }


def print_table(report: dict[str, Any]) -> None:
    r = report["result"]
    print("\n| log | acknowledged | kills | sent again | lost in log | lost served | refused |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print(
        f"| {r['log']} | {r['acknowledged']:,} | {len(r['kills'])} | {r['retried_after_kills']} | "
        f"{r['log_check']['acknowledged_missing_or_different']} | "
        f"{r['served_check']['missing_per_process']} | {r['refused']} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=10000, help="acknowledged writes to reach")
    parser.add_argument("--min-gap", type=float, default=2.0, help="shortest writing time between kills (s)")
    parser.add_argument("--max-gap", type=float, default=8.0, help="longest writing time between kills (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=8793)
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "ccrk-bench-live")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = {
            "bench": "live_crash",
            "command": "python " + " ".join(sys.argv),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"cpu": lu.cpu_model(), "cores": os.cpu_count()},
            "loadavg_before": lu.loadavg(),
            "result": run(args, Path(tmp)),
            "loadavg_after": lu.loadavg(),
        }
    text = json.dumps(report, indent=2)
    print(text)
    print_table(report)
    if args.out:
        args.out.write_text(text + "\n")
    if report["result"]["lost"] or report["result"]["refused"]:
        raise SystemExit(
            f"{report['result']['lost']} acknowledged writes lost, {report['result']['refused']} refused"
        )


if __name__ == "__main__":
    main()
