"""The manifest reader fuzzed (issue 44, point 3): 10,000 hypothesis cases of JSONL and CSV manifests
(``tests/indexer/manifest_fuzz.py``: lone surrogates, bytes that are not UTF-8, NaN/Infinity, huge numbers,
deep nesting, NUL bytes, odd field names, byte-wise mangling), each read, and then either refused with a
``SourceError`` naming the file or written as a build writes its metadata. Counts the cases by outcome;
any other exception is a traceback the CLI would have shown, counted and its first one printed.

    python bench/manifest_fuzz.py --cases 10000 --out bench/results/manifest_fuzz-DATE.json

Prints JSON; not a test (tests/indexer/test_sources.py runs 300 of these cases).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from tests.indexer.manifest_fuzz import MANIFESTS, check_manifest  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    counts: Counter[str] = Counter()
    first: list[str] = []

    @settings(
        max_examples=args.cases,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(MANIFESTS)
    def case(manifest: tuple[str, bytes]) -> None:
        suffix, data = manifest
        try:
            counts[f"{suffix[1:]} {check_manifest(suffix, data)}"] += 1
        except Exception:  # a traceback: counted, not raised (hypothesis would stop and shrink)
            counts[f"{suffix[1:]} traceback"] += 1
            if not first:
                first.append(f"{data!r}\n{traceback.format_exc()}")

    started = time.perf_counter()
    seed(args.seed)(case)()
    seconds = time.perf_counter() - started
    result = {
        "bench": "manifest_fuzz",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "command": " ".join(["python", "bench/manifest_fuzz.py", *sys.argv[1:]]),
        "cases": sum(counts.values()),
        "tracebacks": sum(v for k, v in counts.items() if k.endswith("traceback")),
        "by_outcome": dict(sorted(counts.items())),
        "seconds": round(seconds, 1),
        "first_traceback": first[0] if first else None,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
