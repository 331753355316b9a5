"""bench/gpu_scale.py on a machine without a GPU: it runs on the CPU alone, with the same code and output as
on a GPU machine; its time budget skips a CPU build that would not fit, saying its estimate."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_scale import Run

ROOT = Path(__file__).resolve().parents[2]
no_gpu = pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU driver")


def test_a_cpu_build_that_would_not_fit_the_budget_is_skipped_with_its_estimate() -> None:
    run = Run(budget_s=100.0)
    run.last_build[("ivf", "cpu")] = (1000, 2.0)
    run.last_build[("ivf", "gpu")] = (1000, 2.0)
    assert run.why_skip("ivf", "cpu", 4000) is None  # 2 s x 4 ** 1.5 = 16 s: fits
    why = run.why_skip("ivf", "cpu", 100_000)  # 2 s x 100 ** 1.5 = 2000 s
    assert why is not None and why.startswith("estimated 2000 s from the 1000-vector build (2.0 s), ")
    assert run.why_skip("ivf", "gpu", 100_000) is None, "GPU builds are not estimated: they are the point"
    assert run.why_skip("hnsw", "cpu", 100_000) is None, "no HNSW build yet to scale from"
    assert Run(budget_s=None).why_skip("ivf", "cpu", 10**9) is None
    assert Run(budget_s=0.0).why_skip("hnsw", "cpu", 10) == "time budget spent"


@no_gpu
def test_the_bench_runs_on_the_cpu_alone(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_scale.py"), "--sizes", "3000", "--queries", "300",
         "--recall-queries", "100", "--methods", "ivf,hnsw,cagra", "--no-encode", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["machine"]["gpu"].startswith("faiss index builds on the CPU (CCRK_INDEX_GPU=auto): ")
    (size,) = result["sizes"]
    assert size["n"] == 3000 and size["exact"]["device"] == "cpu" and size["exact"]["queries"] == 100
    rows = {(r["method"], r["device"]): r for r in size["results"]}
    ivf, hnsw = rows[("IVF256,Flat", "cpu")], rows[("HNSW32,Flat", "cpu")]
    for row in (ivf, hnsw):
        assert row["reached"] and row["recall_at_10"] >= 0.95
        # The setting is the sweep's first to reach the target.
        reached = [s for s in row["sweep"] if s["recall_at_10"] >= 0.95]
        assert row["sweep"][-1] == reached[0] and {**reached[0]} == {
            **row["setting"],
            "recall_at_10": row["recall_at_10"],
        }
        assert row["throughput_qps"] > 0 and row["throughput_queries"] == 300
    assert ivf["built_on"] == "cpu" and ivf["nlist"] == 256
    assert rows[("ivf", "gpu")] == {"method": "ivf", "device": "gpu", "skipped": "no GPU (see machine.gpu)"}
    assert ("cagra", "gpu") not in rows, "no GPU: CAGRA is not tried"
    assert "| 3,000 | IVF256,Flat | cpu |" in done.stdout
