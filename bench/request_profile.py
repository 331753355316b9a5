"""Where a plain text search's server time goes: py-spy samples of a real `ccrk serve` under closed-loop load
(re-ranking off), grouped by stage.

    python bench/request_profile.py --items 10000 --concurrency 8 --seconds 10 --out bench/results/x.json

Uses ``bench/search_load.py``'s bench index (built there, ``--items``), server and load generator, and
the ``py-spy`` next to this interpreter (``.venv/bin/py-spy``). ``--gil`` (the default) samples only the
thread holding the GIL, i.e. Python-level CPU of the one process (native code that releases the GIL,
ONNX Runtime's and faiss's inner loops, is not counted); ``--no-gil`` samples every thread that is not idle
(wall time, waits for a core included). Each sample is attributed to the first stage found in its stack
(``STAGES``, in order), else to "other". Prints JSON, then a table; not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.search_load import build_index, queries, run_load, serve  # noqa: E402
from ccrk_settings import Settings  # noqa: E402

# (stage, a substring of a frame): a sample goes to the stage of the frame nearest its leaf that matches.
STAGES: tuple[tuple[str, str], ...] = (
    ("language detection", "store/text/language_id.py"),
    ("language detection", "service/language.py"),
    ("query encoding", "OnnxEncoder._encode"),
    ("ANN search", "IndexVersion.search ("),
    ("exact search (monitor ANN samples)", "search_exact"),
    ("monitor (ANN samples)", "service/monitor.py"),
    ("response building (hits, metadata, labels)", "service/search/responses.py"),
    ("match labels", "service/matching.py"),
    ("search telemetry (metrics, live traffic)", "service/search/telemetry.py"),
    ("pipeline other", "service/search/pipeline.py"),
    ("ranking other", "service/search/ranking.py"),
    ("response JSON", "model_dump_json"),
    ("request JSON + validation", "request_body_to_args"),
    ("dependencies", "solve_dependencies"),
    ("thread hop (to_thread, facade)", "anyio/"),
    ("search route + facade", "service/search/facade.py"),
    ("search route + facade", "service/api/routes/search.py"),
    ("ccrk middleware (metrics, last resort, security headers, upload budget)", "service/middleware.py"),
    ("ccrk middleware (metrics, last resort, security headers, upload budget)", "service/security.py"),
    ("ccrk middleware (metrics, last resort, security headers, upload budget)", "service/upload_budget.py"),
    ("HTTP guard + parsing (httptools)", "service/http_guard.py"),
    ("uvicorn", "uvicorn/"),
    ("FastAPI routing + handling", "fastapi/"),
    ("Starlette routing + middleware", "starlette/"),
    ("pydantic", "pydantic/"),
    ("event loop", "asyncio/"),
)


def stage_of(frames: list[str]) -> str:
    """``frames`` leaf first."""
    for frame in frames:
        for stage, needle in STAGES:
            if needle in frame:
                return stage
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--root", type=Path, default=ROOT / "artifacts" / "bench-indexes")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--gil", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--port", type=int, default=8797)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    texts = queries()
    name = build_index(args.root, args.items, texts, Settings().target_recall)
    bodies = [json.dumps({"query": t, "top_k": 10, "rerank": False}).encode() for t in texts]
    proc = serve(args.root, name, args.port, 1, 2, 1)
    raw = Path(tempfile.mkdtemp()) / "spy.txt"
    try:
        asyncio.run(run_load(args.port, bodies, args.concurrency, 3))  # warm-up
        spy_cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "-d", str(int(args.seconds + 2))]
        spy_cmd += ["-r", str(args.rate), "-f", "raw", "-o", str(raw), "--pid", str(proc.pid)]
        spy_cmd += ["--gil"] if args.gil else []
        spy = subprocess.Popen(spy_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)
        load = asyncio.run(run_load(args.port, bodies, args.concurrency, args.seconds))
        spy.wait(120)
    finally:
        proc.terminate()
        proc.wait(30)
    idle = (
        "Condition.wait",
        "_worker (concurrent",
        "Runner.run",
        "WorkerThread.run (anyio/_backends/_asyncio.py:1133)",
    )
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if frames[-1].startswith(idle):
            continue
        counts[stage_of(frames[::-1])] += int(n)
    total = sum(counts.values())
    server_ms = load["server_total_ms"]
    result: dict[str, Any] = {
        "benchmark": "request_profile",
        "command": "python bench/request_profile.py " + " ".join(sys.argv[1:]),
        "items": args.items,
        "concurrency": args.concurrency,
        "gil_only": args.gil,
        "load": load,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "samples": total,
        "share_by_stage": {k: round(v / total, 4) for k, v in counts.most_common()},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print(f"\n{load['qps']} q/s, p50 {load['p50_ms']} ms, server total {server_ms} ms; {total} samples\n")
    print("| stage | share of samples |\n|---|---|")
    for stage, share in result["share_by_stage"].items():
        print(f"| {stage} | {100 * share:.1f} % |")


if __name__ == "__main__":
    main()
