"""Server CPU per text search in short windows of closed-loop load, for a machine shared with other jobs.

``bench/search_load.py`` reports one CPU-per-query figure per load point, over its whole run; on a shared
machine other jobs' load inflates it (cache and core contention, waits) by up to 2x between identical runs.
This runs the same server, bench index and load generator in ``--windows`` windows of ``--window-s`` each and
reports the quietest windows' figures (min, 10th percentile) beside the median: what a query costs when the
machine leaves the server alone. Re-ranking off; prints JSON; not a test.

    python bench/search_cpu_windows.py --items 100000 --concurrency 1,32 --windows 15 --out x.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.search_load import build_index, queries, run_load, serve, set_nice, tree_cpu_s  # noqa: E402
from ccrk_settings import Settings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=REPO / "artifacts" / "bench-indexes")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--windows", type=int, default=15)
    parser.add_argument("--window-s", type=float, default=1.0)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    texts = queries()
    name = build_index(args.root, args.items, texts, Settings().target_recall)
    bodies = [json.dumps({"query": t, "top_k": 10, "rerank": False, "rerank_k": 128}).encode() for t in texts]
    set_nice(0)  # the server at the normal priority, the load generator above it (as search_load.py)
    proc = serve(args.root, name, args.port, 1, 2, args.processes)
    set_nice(-5)
    results: dict[int, dict[str, float]] = {}
    try:
        for clients in (int(c) for c in args.concurrency.split(",") if c.strip()):
            asyncio.run(run_load(args.port, bodies, clients, 1.0))  # warm-up
            cpu_ms, qps = [], []
            for _ in range(args.windows):
                before = tree_cpu_s(proc.pid)
                load = asyncio.run(run_load(args.port, bodies, clients, args.window_s))
                served = load["requests"] + load["warmup_requests"]  # run_load warms up for 1 s first
                cpu_ms.append((tree_cpu_s(proc.pid) - before) * 1000 / max(served, 1))
                qps.append(load["qps"])
            cpu_ms.sort()
            results[clients] = {
                "server_cpu_ms_min": round(cpu_ms[0], 3),
                "server_cpu_ms_p10": round(cpu_ms[len(cpu_ms) // 10], 3),
                "server_cpu_ms_median": round(statistics.median(cpu_ms), 3),
                "qps_max": max(qps),
                "qps_median": statistics.median(qps),
                "windows": len(cpu_ms),
            }
            print(clients, results[clients], file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    report = {
        "command": "python bench/search_cpu_windows.py " + " ".join(sys.argv[1:]),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "results": results,
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
