"""Memory of serving several indexes in one process: the resident memory of ``ccrk serve`` with one index
of ``--items`` items, then with 2 and 3 such indexes (copies, each its own files), after the same searches
on every index; the model is loaded once in each case.

    .venv/bin/python bench/catalogue_memory.py --out bench/results/catalogue_memory-DATE.json

The index is ``bench/search_load.build_index``'s (HNSW over synthetic items around real image embeddings,
an all-zero re-rank store: re-ranking off). Prints a JSON document, then a table; not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fair_share import free_port  # noqa: E402
from bench.search_load import build_index, queries  # noqa: E402

CCRK = str(Path(sys.executable).parent / "ccrk")


def tree_rss_mb(pid: int) -> float:
    """Resident memory of the process (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def measure(root: Path, names: list[str], texts: list[str]) -> float:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")}
    env.update(
        {
            "CCRK_THREADS": "1",
            "CCRK_RERANK": "false",
            "CCRK_ANN_SAMPLE_RATE": "0",
            "CCRK_HISTORY_DB": str(Path(tempfile.mkdtemp(prefix="ccrk-bench-")) / "h.sqlite"),
        }
    )
    command = [CCRK, "serve", "--port", str(port), "--index-root", str(root), "--index-name", ",".join(names)]
    proc = subprocess.Popen([*command, "--log-level", "warning"], env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "not ready"
            time.sleep(0.5)
        with httpx.Client(base_url=url, timeout=30) as client:
            for name in names:
                for text in texts[:200]:
                    response = client.post(f"/v1/indexes/{name}/search", json={"query": text, "top_k": 10})
                    assert response.status_code == 200, response.text
        return round(tree_rss_mb(proc.pid), 1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--root", type=Path, default=ROOT / "artifacts" / "bench-catalogue-memory")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    texts = queries()
    name = build_index(args.root, args.items, texts, 0.95)
    names = [name]
    for copy in ("copy-b", "copy-c"):
        if not (args.root / copy).exists():
            shutil.copytree(args.root / name, args.root / copy, symlinks=True)
        names.append(copy)
    rss = {n: measure(args.root, names[:n], texts) for n in (1, 2, 3)}
    document = {
        "command": "python " + " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
        "items_per_index": args.items,
        # Apparent size: the bench's re-rank store is sparse and all zero (never read, re-ranking off).
        "index_bytes_on_disk": sum(f.stat().st_size for f in (args.root / name).rglob("*") if f.is_file()),
        "rss_mb_by_indexes": rss,
        "rss_mb_per_extra_index": round((rss[3] - rss[1]) / 2, 1),
    }
    text = json.dumps(document, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print("\nindexes  RSS MB")
    for n, mb in rss.items():
        print(f"{n:>7}  {mb:>6.1f}")
    print(f"per extra index of {args.items} items: {document['rss_mb_per_extra_index']} MB")


if __name__ == "__main__":
    main()
