"""`make gpu-check`: every GPU path of the product checked in one run on a machine with a CUDA GPU.

    python bench/gpu_check.py [--out FILE] [--budget-s 480]

Six checks, each independent (one failing or missing does not stop the others), in this order:
- ``faiss_gpu``: faiss-gpu builds an exact (Flat) and an IVF index on the GPU through the indexer's own
  ``build_faiss_index``; the GPU's exact answers equal the CPU's (ids, scores within 1e-4) and the IVF
  index built on the GPU keeps the CPU-built one's recall@10 against exact search (within 0.02: k-means on
  the GPU sums in another order, so its centroids differ slightly).
- ``onnx_cuda``: ONNX Runtime's CUDA execution provider encodes the default model's texts and images
  within 1e-3 of the CPU provider (the embeddings, absolute), and its hidden states, image tokens and fusion
  scores within 1e-3 of their own scale; with the batch timings of both, and the same with TF32 off.
- ``starter_cuda``: the starter model, built in the work folder, encodes images on the CUDA provider
  within 1e-3 of the CPU's: its text-searchable embeddings and its visual (photo search) embeddings.
- ``cuda_training``: 50 steps of the demo architecture trained on CUDA (AMP) straight, twice, and 25 steps
  then a resumed run to 50 from the checkpoint: the resumed run starts at step 25 and ends at the straight
  run's weights, within 10x the difference between the two straight runs (CUDA's atomic adds make runs
  differ by rounding) and at most 1e-4 where they are equal.
- ``index_throughput``: ``bench/index_throughput.py`` in a short mode on the GPU (image build items/s, the
  ANN index build).
- ``search_load``: ``bench/search_load.py`` in a short mode with the service's encoder on the GPU (q/s and
  p50, re-ranking off and on).

Prints a table and then one summary line (``gpu-check: PASS 6/6 ...`` or ``gpu-check: FAIL ...``) and
writes the JSON document to ``--out`` (default ``bench/results/gpu-check-<date>.json``). Without a CUDA GPU
it stops at once, checks nothing and exits 2. Exit 1 when a check failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRAIN_STEPS = 50
ONNX_TOLERANCE = 1e-3


@dataclass
class CheckResult:
    name: str
    status: str  # pass | fail
    seconds: float = 0.0
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


def gpu_present() -> str | None:
    """The GPU's name from ``nvidia-smi -L``, or None where there is no NVIDIA driver or GPU."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line for line in listing.stdout.splitlines() if line.startswith("GPU ")]
    return lines[0] if listing.returncode == 0 and lines else None


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    except ImportError as exc:
        env["torch"] = f"not importable: {exc}"
    try:
        import onnxruntime as ort

        env["onnxruntime"] = ort.__version__
        env["onnxruntime_providers"] = ort.get_available_providers()
    except ImportError as exc:
        env["onnxruntime"] = f"not importable: {exc}"
    try:
        import faiss

        env["faiss"] = faiss.__version__
        env["faiss_gpus"] = faiss.get_num_gpus()
    except ImportError as exc:
        env["faiss"] = f"not importable: {exc}"
    return env


def _clustered(n: int, d: int, seed: int) -> np.ndarray:
    """Unit vectors around 1,000 centres (real embeddings have neighbourhoods; a uniform cloud has none)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((1000, d)).astype(np.float32)
    x = centres[rng.integers(0, 1000, n)] + 0.6 * rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def check_faiss_gpu(n: int = 200_000, d: int = 256) -> dict[str, Any]:
    import faiss

    from indexer.ann import build_faiss_index, choose_index, recall_at
    from indexer.gpu import decide

    # The indexer's own decision (CCRK_INDEX_GPU=auto): the self-test runs in a child process, so a wheel
    # without kernels for this GPU (CUDA error 209, which aborts faiss) fails this check, not the run.
    decision = decide("auto")
    if not decision.use_gpu:
        raise CheckFailed(
            f"faiss {faiss.__version__}: {decision.reason} (install a gpu extra: pyproject.toml,"
            " deploy/gpu_extra.py)"
        )
    base, queries = _clustered(n, d, 0), _clustered(1000, d, 1)
    cpu_flat = faiss.IndexFlatIP(d)
    cpu_flat.add(base)
    t0 = time.perf_counter()
    exact_scores, exact_ids = cpu_flat.search(queries, 10)
    cpu_exact_s = time.perf_counter() - t0
    res = faiss.StandardGpuResources()
    gpu_flat = faiss.index_cpu_to_gpu(res, 0, cpu_flat)
    gpu_flat.search(queries[:10], 10)  # warm-up: kernels load on first use
    t0 = time.perf_counter()
    gpu_scores, gpu_ids = gpu_flat.search(queries, 10)
    gpu_exact_s = time.perf_counter() - t0
    # Ties can swap places between the two; a differing id must then have the same score.
    same_ids = float(np.mean(gpu_ids == exact_ids))
    score_diff = float(np.abs(gpu_scores - exact_scores).max())
    plan = choose_index(n, d, exact_max_items=0, memory_budget_mb=max(1, n * (d + 8) // 2**20 + 8))
    built: dict[str, Any] = {}
    for device, use_gpu in (("cpu", False), ("gpu", True)):
        t0 = time.perf_counter()
        index, notes = build_faiss_index(base, plan, use_gpu=use_gpu)
        build_s = time.perf_counter() - t0
        faiss.extract_index_ivf(index).nprobe = 16
        _, ann_ids = index.search(queries, 10)
        built[device] = {
            "build_s": round(build_s, 2), "device": notes.get("device"),
            "recall_at_10": round(recall_at(ann_ids, exact_ids, 10), 4),
            "fallback": notes.get("gpu_fallback"),
        }  # fmt: skip
    figures = {
        "vectors": f"{n} x {d}", "exact_ids_equal": round(same_ids, 5), "exact_max_score_diff": score_diff,
        "exact_1000_queries_s": {"cpu": round(cpu_exact_s, 4), "gpu": round(gpu_exact_s, 4)},
        "ivf_factory": plan.factory, "ivf": built, "decision": decision.message,
    }  # fmt: skip
    problems = []
    if same_ids < 0.999 or score_diff > 1e-4:
        problems.append(
            f"GPU exact search differs: ids equal {same_ids:.4f}, max score diff {score_diff:.2e}"
        )
    if built["gpu"]["device"] != "gpu":
        problems.append(f"IVF build fell back to the CPU: {built['gpu']['fallback']}")
    if abs(built["gpu"]["recall_at_10"] - built["cpu"]["recall_at_10"]) > 0.02:
        problems.append("the GPU-built IVF index's recall differs from the CPU-built one's by more than 0.02")
    if problems:
        raise CheckFailed("; ".join(problems), figures)
    return figures


def _catalogue(folder: Path, n: int) -> list[dict[str, Any]]:
    from synthetic.synth import SynthConfig, generate_catalogue

    if not (folder / "test.jsonl").is_file():
        generate_catalogue(
            folder, SynthConfig(seed=3, n_train=0, n_val=0, n_test=n, image_size=96), workers=4
        )
    lines = (folder / "test.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def check_onnx_cuda(work: Path, device: str) -> dict[str, Any]:
    from PIL import Image

    from ccrk_settings import DEFAULT_MODEL_DIR
    from model.runtime.onnx_runtime import OnnxEncoder

    records = _catalogue(work / "catalogue", 64)
    texts = [caption for rec in records for captions in rec["captions"].values() for caption in captions[:1]]
    first_texts = [next(iter(rec["captions"].values()))[0] for rec in records]  # one per image, for fusion
    images = [Image.open(work / "catalogue" / rec["image"]).convert("RGB") for rec in records]
    encoders = {"cpu": OnnxEncoder(DEFAULT_MODEL_DIR, device="cpu", threads=4),
                "gpu": OnnxEncoder(DEFAULT_MODEL_DIR, device=device, threads=4),
                # The CUDA provider's default multiplies in TF32; this one in fp32, to tell the two apart.
                "gpu_fp32": OnnxEncoder(DEFAULT_MODEL_DIR, device=device, threads=4,
                                        cuda_options={"use_tf32": "0"})}  # fmt: skip
    figures: dict[str, Any] = {
        "texts": len(texts),
        "images": len(images),
        "gpu_device": encoders["gpu"].device,
    }
    outputs: dict[str, dict[str, np.ndarray]] = {}
    for name, encoder in encoders.items():
        encoder.encode_text(texts[:8])  # warm-up (CUDA kernels and cuDNN plans load on first use)
        encoder.encode_images(images[:8])
        t0 = time.perf_counter()
        text_out = encoder.encode_text(texts)
        t1 = time.perf_counter()
        image_out = encoder.encode_images(images)
        t2 = time.perf_counter()
        pairs = encoder.encode_text(first_texts)
        scores = {
            out: encoder.score_aligned(pairs, image_out.tokens, out) for out in sorted(encoder.fusion_outputs)
        }
        t3 = time.perf_counter()
        outputs[name] = {"text_embeds": text_out.embeds, "text_states": text_out.states,
                         "image_embeds": image_out.embeds, "image_tokens": image_out.tokens,
                         **{f"fusion_{k}": np.asarray(v) for k, v in scores.items()}}  # fmt: skip
        figures[f"{name}_ms"] = {
            "texts": round((t1 - t0) * 1e3, 1), "images": round((t2 - t1) * 1e3, 1),
            "fusion_pairs": round((t3 - t2) * 1e3, 1),
        }  # fmt: skip
    cpu_out = outputs["cpu"]
    for name in ("gpu", "gpu_fp32"):
        figures[f"{name}_max_abs_diff"] = {
            k: float(np.abs(cpu_out[k] - v).max()) for k, v in outputs[name].items()
        }
        # Relative to the output's own scale (hidden states and fusion logits are not unit vectors).
        figures[f"{name}_max_rel_diff"] = {
            k: float(np.abs(cpu_out[k] - v).max() / max(1e-12, float(np.abs(cpu_out[k]).max())))
            for k, v in outputs[name].items()
        }
    if encoders["gpu"].device != device:
        raise CheckFailed(f"the {device} provider did not start: the session runs on the CPU", figures)
    # The encodings (the embeddings that are stored and searched) within 1e-3 absolute; the other outputs
    # within 1e-3 of their own scale.
    bad = [
        f"{k} {v:.2e}"
        for k, v in figures["gpu_max_abs_diff"].items()
        if k.endswith("embeds") and v > ONNX_TOLERANCE
    ]
    bad += [f"{k} {v:.2e} (relative)" for k, v in figures["gpu_max_rel_diff"].items() if v > ONNX_TOLERANCE]
    if bad:
        raise CheckFailed(f"CUDA output differs from the CPU's: {', '.join(bad)}", figures)
    return figures


def check_starter_cuda(work: Path, device: str) -> dict[str, Any]:
    """The starter model (``ccrk model build-starter``, built here): its image graph's two outputs, the
    class-prototype embeddings that text queries search and the visual embeddings that photo queries and
    "more like this" search, on the CUDA provider within 1e-3 (absolute) of the CPU's."""
    from PIL import Image

    from model.runtime import load_encoder
    from model.starter.build import build_starter

    starter = work / "ccrk-starter"
    if not (starter / "config.json").is_file():
        build_starter(starter, force=True)
    records = _catalogue(work / "catalogue", 64)
    images = [Image.open(work / "catalogue" / rec["image"]).convert("RGB") for rec in records]
    encoders = {"cpu": load_encoder(starter, device="cpu", threads=4),
                "gpu": load_encoder(starter, device=device, threads=4)}  # fmt: skip
    figures: dict[str, Any] = {"images": len(images), "gpu_device": encoders["gpu"].device}
    outputs: dict[str, dict[str, np.ndarray]] = {}
    for name, encoder in encoders.items():
        # Warm-up on the timed batch's shape: the CUDA provider searches cuDNN's convolution algorithms once
        # per new input shape (EfficientNet is all convolutions), which is not the steady cost.
        encoder.encode_images(images)
        t0 = time.perf_counter()
        out = encoder.encode_images(images)
        figures[f"{name}_ms"] = {"images": round((time.perf_counter() - t0) * 1e3, 1)}
        if out.visual is None:
            raise CheckFailed("the starter's image graph has no visual output", figures)
        outputs[name] = {"image_embeds": out.embeds, "visual_embeds": out.visual}
    figures["gpu_max_abs_diff"] = {
        k: float(np.abs(outputs["cpu"][k] - v).max()) for k, v in outputs["gpu"].items()
    }
    if encoders["gpu"].device != device:
        raise CheckFailed(f"the {device} provider did not start: the session runs on the CPU", figures)
    bad = [f"{k} {v:.2e}" for k, v in figures["gpu_max_abs_diff"].items() if v > ONNX_TOLERANCE]
    if bad:
        raise CheckFailed(f"CUDA output differs from the CPU's: {', '.join(bad)}", figures)
    return figures


def check_cuda_training(work: Path, device: str) -> dict[str, Any]:
    import torch

    from model.configs import get_preset
    from model.modeling import CCRkModel
    from model.training import TrainConfig, Trainer

    if device == "cuda" and not torch.cuda.is_available():
        raise CheckFailed(f"torch {torch.__version__} sees no CUDA device")
    data = work / "train-catalogue"
    if not (data / "train.jsonl").is_file():
        from synthetic.synth import SynthConfig, generate_catalogue

        generate_catalogue(
            data, SynthConfig(seed=4, n_train=1600, n_val=0, n_test=0, image_size=96), workers=8
        )

    def config(out: Path, steps: int) -> TrainConfig:
        # Warm-up longer than the run: the LR schedule's length (max_steps) then never shapes the first
        # 25 steps, so the run stopped at 25 and resumed is the same computation as the straight one.
        return TrainConfig(
            data_dir=data, output_dir=out, batch_size=32, max_steps=steps, epochs=1, val_limit=0,
            save_every_steps=TRAIN_STEPS // 2, device=device, warmup_steps=2 * TRAIN_STEPS, threads=4,
        )  # fmt: skip

    def train(out: Path, steps: int, log: Callable[[str], None]) -> Any:
        return Trainer(get_preset("demo"), config(out, steps), log=log, show_progress=False).run()

    t0 = time.perf_counter()
    straight = train(work / "run-a", TRAIN_STEPS, lambda _: None)
    straight_s = time.perf_counter() - t0
    again = train(work / "run-a2", TRAIN_STEPS, lambda _: None)  # the run-to-run floor (CUDA atomics)
    train(work / "run-b", TRAIN_STEPS // 2, lambda _: None)
    resumed_logs: list[str] = []
    resumed = train(work / "run-b", TRAIN_STEPS, resumed_logs.append)

    def weight_diff(x: Path, y: Path) -> float:
        a, b = CCRkModel.from_pretrained(x).state_dict(), CCRkModel.from_pretrained(y).state_dict()
        return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)

    worst = weight_diff(straight.model_dir, resumed.model_dir)
    floor = weight_diff(straight.model_dir, again.model_dir)
    losses = [h["loss"]["total"] for h in straight.history]
    figures = {
        "steps": straight.steps, "resumed_steps": resumed.steps, "straight_s": round(straight_s, 1),
        "samples_per_s": round(straight.samples_per_second, 1), "max_weight_diff_resumed": worst,
        "max_weight_diff_two_straight_runs": floor,
        "resumed_log": next((line for line in resumed_logs if "resumed" in line), None),
        "loss_first_epoch": losses[:1],
        "gpu_peak_memory_gib": (
            round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None
        ),
    }  # fmt: skip
    if straight.steps != TRAIN_STEPS or resumed.steps != TRAIN_STEPS:
        raise CheckFailed(f"ran {straight.steps} and {resumed.steps} steps, not {TRAIN_STEPS}", figures)
    if not any("resumed" in line and f"step {TRAIN_STEPS // 2}" in line for line in resumed_logs):
        raise CheckFailed("the second run did not resume from the step-25 checkpoint", figures)
    if worst > max(1e-4, 10 * floor):
        raise CheckFailed(
            f"resumed weights differ from the straight run's by {worst:.2e} (two straight runs: {floor:.2e})",
            figures,
        )
    return figures


def _bench(script: str, args: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    command = [sys.executable, str(ROOT / "bench" / script), *args, "--out", str(out)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        raise CheckFailed(f"{script} ran past {timeout_s:.0f} s") from exc
    if done.returncode != 0 or not out.is_file():
        raise CheckFailed(f"{script} exited {done.returncode}: {done.stderr.strip()[-600:]}")
    result = json.loads(out.read_text(encoding="utf-8"))
    result["command"] = " ".join(["python", f"bench/{script}", *args])
    result["wall_s"] = round(time.perf_counter() - started, 1)
    end = done.stdout.find("\n}\n")  # the benches print their JSON (indented), then their tables
    tables = done.stdout[end + 3 :].strip() if end >= 0 else ""
    if tables:
        print(tables, flush=True)
    return result


def check_index_throughput(work: Path, device: str, sizes: argparse.Namespace) -> dict[str, Any]:
    result = _bench(
        "index_throughput.py",
        ["--catalogue-items", str(sizes.catalogue_items), "--vector-sizes", str(sizes.vectors),
         "--queries", "200", "--exact-queries", "50", "--threads", "4", "--workers", "8", "--device", device,
         "--photos", str(work / "no-photos")],
        work / "index_throughput.json", sizes.bench_timeout_s,
    )  # fmt: skip
    builds = result.get("builds", {})
    if not builds:
        raise CheckFailed("no image build was measured", result)
    return result


def check_search_load(work: Path, device: str, sizes: argparse.Namespace) -> dict[str, Any]:
    os.environ["BENCH_SERVER_ENV"] = f"CCRK_DEVICE={device}"
    return _bench(
        "search_load.py",
        ["--items", str(sizes.load_items), "--root", str(work / "load-indexes"), "--seconds", "4",
         "--concurrency", "1,8", "--open-rates", "", "--rerank", "off,on", "--threads", "2",
         "--workers", "4", "--client-nice", "0"],
        work / "search_load.json", sizes.bench_timeout_s,
    )  # fmt: skip


class CheckFailed(RuntimeError):
    def __init__(self, reason: str, figures: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.figures = figures or {}


def run_check(name: str, fn: Callable[[], dict[str, Any]]) -> CheckResult:
    print(f"gpu-check: {name} ...", flush=True)
    started = time.perf_counter()
    try:
        figures = fn()
        result = CheckResult(name, "pass", figures=figures)
    except CheckFailed as exc:
        result = CheckResult(name, "fail", reason=str(exc), figures=exc.figures)
    except Exception as exc:  # a check that breaks is a failed check, reported; the others still run
        result = CheckResult(name, "fail", reason=f"{type(exc).__name__}: {exc}"[:800])
    result.seconds = round(time.perf_counter() - started, 1)
    print(f"gpu-check: {name} {result.status} in {result.seconds} s {result.reason}", flush=True)
    return result


def run_isolated(name: str, argv: list[str], work: Path, timeout_s: float) -> CheckResult:
    """``name`` in a process of its own: a CUDA library that aborts (a faiss assertion, a kernel image
    missing for this GPU) fails that check, not the run, and the others still run."""
    print(f"gpu-check: {name} ...", flush=True)
    out = work / f"check-{name}.json"
    out.unlink(missing_ok=True)
    started = time.perf_counter()
    command = [sys.executable, str(Path(__file__).resolve()), *argv, "--child", name, "--child-out", str(out)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
        stderr, code = done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        stderr, code = str(exc.stderr or ""), None
    if out.is_file():
        result = CheckResult(**json.loads(out.read_text(encoding="utf-8")))
    else:
        why = f"ran past {timeout_s:.0f} s" if code is None else f"its process died (exit {code})"
        lines = [line for line in stderr.splitlines() if line.strip()]
        result = CheckResult(name, "fail", reason=f"{why}: {' | '.join(lines[-3:])}"[:800])
    result.seconds = round(time.perf_counter() - started, 1)
    print(f"gpu-check: {name} {result.status} in {result.seconds} s {result.reason}", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    today = datetime.date.today().isoformat()
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / f"gpu-check-{today}.json")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--only", default="", help="comma-separated check names (default: all)")
    parser.add_argument("--bench-timeout-s", type=float, default=180.0, help="limit of each bench run")
    parser.add_argument("--catalogue-items", type=int, default=2000, help="index_throughput's image build")
    parser.add_argument("--vectors", type=int, default=200_000, help="index_throughput's ANN build")
    parser.add_argument("--load-items", type=int, default=20_000, help="search_load's index")
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda",
        help="cpu: a rehearsal of the script itself on a machine without a GPU (every 'GPU' side runs on"
        " the CPU; the figures are not GPU figures and go to --work, never to bench/results)",
    )  # fmt: skip
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one check, in its own process
    parser.add_argument("--child-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    gpu = gpu_present() if args.device == "cuda" else "rehearsal on the CPU (no GPU checked)"
    if gpu is None:
        print("gpu-check: FAILED: no CUDA GPU on this machine (nvidia-smi is missing or lists no GPU);"
              " nothing was checked", file=sys.stderr)  # fmt: skip
        return 2
    started = time.perf_counter()
    work = args.work or Path(tempfile.mkdtemp(prefix="ccrk-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.device == "cpu":
        args.out = work / "gpu-check-rehearsal.json"
    env = {} if args.child else environment()
    if env:
        print(json.dumps(env), flush=True)
    checks: dict[str, Callable[[], dict[str, Any]]] = {
        "faiss_gpu": check_faiss_gpu,
        "onnx_cuda": lambda: check_onnx_cuda(work, args.device),
        "starter_cuda": lambda: check_starter_cuda(work, args.device),
        "cuda_training": lambda: check_cuda_training(work, args.device),
        "index_throughput": lambda: check_index_throughput(work, args.device, args),
        "search_load": lambda: check_search_load(work, args.device, args),
    }
    chosen = [c.strip() for c in args.only.split(",") if c.strip()] or list(checks)
    unknown = sorted(set(chosen) - set(checks))
    if unknown:
        parser.error(f"--only: unknown checks {unknown}; known: {', '.join(checks)}")
    if args.child:
        result = run_check(args.child, checks[args.child])
        args.child_out.write_text(json.dumps(asdict(result), default=str), encoding="utf-8")
        return 0
    argv = ["--work", str(work), "--device", args.device, "--bench-timeout-s", str(args.bench_timeout_s),
            "--catalogue-items", str(args.catalogue_items), "--vectors", str(args.vectors),
            "--load-items", str(args.load_items)]  # fmt: skip
    results = [run_isolated(name, argv, work, 2 * args.bench_timeout_s + 60) for name in chosen]
    document = {
        "command": "make gpu-check", "date": today, "nvidia_smi": gpu, "environment": env,
        "seconds": round(time.perf_counter() - started, 1), "checks": [asdict(r) for r in results],
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    print("\n| check | result | s | reason |\n| --- | --- | --- | --- |")
    for r in results:
        print(f"| {r.name} | {r.status} | {r.seconds} | {r.reason[:160]} |")
    passed = sum(r.status == "pass" for r in results)
    failed = [r.name for r in results if r.status != "pass"]
    verdict = "PASS" if not failed else "FAIL"
    print(f"gpu-check: {verdict} {passed}/{len(results)} on {env.get('gpu', gpu)} in {document['seconds']} s"
          + (f"; failed: {', '.join(failed)}" if failed else "") + f"; figures in {args.out}")  # fmt: skip
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
