"""Encoder benchmark: query latency, image throughput and fusion re-ranking cost, per runtime.

    python bench/encoders.py --model model/pretrained/ccrk-demo            # a model directory
    python bench/encoders.py --preset ccrk-paper                           # random weights, paper shape

Measures, on ``--threads`` CPU threads (2 by default):
- text encoder latency at batch 1 for 8- and 32-token queries, p50/p99 over ``--calls`` calls;
- image encoder throughput at batch 32 (images/s);
- fusion scoring of 128 candidates for one query (ms).
Each runtime (torch eager, ONNX Runtime) runs in its own process: torch and ONNX Runtime in one process
slow each other. Also prints the FLOP-based floor of each figure at ``--gflops`` sustained GFLOP/s. Prints
a JSON document, then a table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model.configs import CCRkConfig, get_preset  # noqa: E402
from model.modeling import read_config  # noqa: E402


def percentile_ms(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples) * 1000.0, q))


def text_flops(cfg: CCRkConfig, tokens: int) -> float:
    """Multiply-adds x2 of the text layers and projection for one sequence."""
    h, inter = cfg.text.hidden_size, cfg.text.intermediate_size
    per_layer = tokens * (8 * h * h + 4 * h * inter) + 4 * tokens * tokens * h
    return cfg.text.num_text_layers * per_layer + 2 * h * cfg.embed_dim


def fusion_flops(cfg: CCRkConfig, tokens: int, image_tokens: int, width: int) -> float:
    h, inter = cfg.text.hidden_size, cfg.text.intermediate_size
    self_attn = tokens * 8 * h * h + 4 * tokens * tokens * h
    cross = tokens * 4 * h * h + image_tokens * 4 * width * h + 4 * tokens * image_tokens * h
    ffn = tokens * 4 * h * inter
    itm_head = 2 * (h * 2 * h + 2 * h * 2)
    return cfg.text.num_fusion_layers * (self_attn + cross + ffn) + itm_head


def run_backend(model_dir: Path, backend: str, threads: int, calls: int) -> dict:
    """Measure one runtime in this process."""
    from model.runtime import load_encoder

    # "onnx-int8": the dynamically quantized query and fusion graphs (the image graph stays fp32).
    runtime, int8 = ("onnx", True) if backend == "onnx-int8" else (backend, False)
    encoder = load_encoder(model_dir, runtime, device="cpu", threads=threads, int8=int8)
    cfg = encoder.config
    result: dict = {"backend": backend}
    words = [
        "red",
        "striped",
        "mug",
        "on",
        "the",
        "left",
        "with",
        "a",
        "grey",
        "background",
        "and",
        "three",
        "more",
        "items",
        "please",
    ]
    for target in (8, 32):
        # Grow the query until it tokenizes to the target length (specials included).
        text = ""
        for i in range(1000):
            candidate = (text + " " + words[i % len(words)]).strip()
            if encoder.encode_text([candidate]).mask.shape[1] > target:
                break
            text = candidate
        length = int(encoder.encode_text([text]).mask.shape[1])
        for _ in range(20):
            encoder.encode_text([text])
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            encoder.encode_text([text])
            samples.append(time.perf_counter() - start)
        result[f"text_{target}"] = {
            "tokens": length,
            "p50_ms": percentile_ms(samples, 50),
            "p99_ms": percentile_ms(samples, 99),
        }
    size = cfg.vision.image_size
    pixels = np.random.default_rng(0).integers(0, 256, (32, 3, size, size), dtype=np.uint8)
    encoder.encode_images(pixels[:2])
    rounds = 3
    start = time.perf_counter()
    for _ in range(rounds):
        images = encoder.encode_images(pixels)
    elapsed = time.perf_counter() - start
    result["image_batch32"] = {"images_per_s": 32 * rounds / elapsed}
    query = encoder.encode_text(["three red striped mugs on the left"]).row(0)
    tokens = np.repeat(images.tokens, 4, axis=0)[:128]
    for _ in range(3):
        encoder.score_pairs(query, tokens)
    samples = []
    for _ in range(max(10, calls // 10)):
        start = time.perf_counter()
        encoder.score_pairs(query, tokens)
        samples.append(time.perf_counter() - start)
    result["fusion_128"] = {
        "query_tokens": int(query.mask.shape[1]),
        "image_tokens": int(tokens.shape[1]),
        "p50_ms": percentile_ms(samples, 50),
        "p99_ms": percentile_ms(samples, 99),
    }
    return result


def floors(cfg: CCRkConfig, measured: dict, gflops: float) -> dict:
    """Time each measured workload would take at ``gflops`` sustained (the compute floor)."""
    out = {}
    for key in ("text_8", "text_32"):
        tokens = measured[key]["tokens"]
        out[key + "_floor_ms"] = text_flops(cfg, tokens) / (gflops * 1e9) * 1000
    fusion = measured["fusion_128"]
    width = cfg.text.hidden_size
    out["fusion_128_floor_ms"] = (
        128 * fusion_flops(cfg, fusion["query_tokens"], fusion["image_tokens"], width) / (gflops * 1e9) * 1000
    )
    return out


def prepare_model(args: argparse.Namespace, workdir: Path) -> Path:
    """A model directory with an ONNX export: the given one, or random weights of a preset."""
    from model.export import export_onnx
    from model.modeling import CCRkModel
    from model.onnx_format import EXPORT_MANIFEST, ONNX_DIR

    if args.model:
        model_dir = Path(args.model)
        if not (model_dir / ONNX_DIR / EXPORT_MANIFEST).is_file():
            export_onnx(CCRkModel.from_pretrained(model_dir), model_dir)
        return model_dir
    import torch

    from model.tokenization import train_tokenizer

    torch.manual_seed(0)
    cfg = get_preset(args.preset)
    model = CCRkModel(cfg).eval()
    words = [
        "red",
        "blue",
        "green",
        "striped",
        "dotted",
        "mug",
        "hat",
        "lamp",
        "left",
        "right",
        "centre",
        "grey",
        "background",
    ]
    tokenizer = train_tokenizer([" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20, 400, 64)
    model_dir = workdir / args.preset
    model.save_pretrained(model_dir, tokenizer)
    export_onnx(model, model_dir)
    return model_dir


def table(report: dict) -> str:
    lines = [
        f"{'backend':<8}{'text8 p50':>11}{'text8 p99':>11}{'text32 p50':>12}{'text32 p99':>12}"
        f"{'img/s b32':>11}{'fuse128 p50':>13}"
    ]
    for r in report["runs"]:
        lines.append(
            f"{r['backend']:<8}{r['text_8']['p50_ms']:>9.2f}ms{r['text_8']['p99_ms']:>9.2f}ms"
            f"{r['text_32']['p50_ms']:>10.2f}ms{r['text_32']['p99_ms']:>10.2f}ms"
            f"{r['image_batch32']['images_per_s']:>11.1f}{r['fusion_128']['p50_ms']:>11.2f}ms"
        )
    f = report["floors"]
    lines.append(
        f"{'floor':<8}{f['text_8_floor_ms']:>9.3f}ms{'':>11}{f['text_32_floor_ms']:>10.3f}ms{'':>12}{'':>11}"
        f"{f['fusion_128_floor_ms']:>11.2f}ms   (at {report['gflops']:.0f} GFLOP/s)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="model directory")
    source.add_argument("--preset", help="model preset with random weights (e.g. ccrk-paper)")
    parser.add_argument("--backends", default="torch,onnx", help="comma-separated: torch, onnx, onnx-int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--gflops", type=float, default=200.0, help="sustained GFLOP/s for the floor")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--worker", nargs=2, metavar=("MODEL_DIR", "BACKEND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_backend(Path(args.worker[0]), args.worker[1], args.threads, args.calls)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = prepare_model(args, Path(tmp))
        if "onnx-int8" in args.backends.split(","):
            from model.export import quantize_int8
            from model.onnx_format import EXPORT_MANIFEST, ONNX_DIR

            manifest = json.loads((model_dir / ONNX_DIR / EXPORT_MANIFEST).read_text(encoding="utf-8"))
            if "int8_graphs" not in manifest:
                quantize_int8(model_dir)
        runs = []
        for backend in args.backends.split(","):
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--model",
                    str(model_dir),
                    "--worker",
                    str(model_dir),
                    backend,
                    "--threads",
                    str(args.threads),
                    "--calls",
                    str(args.calls),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode:
                raise SystemExit(f"{backend} benchmark failed:\n{done.stderr}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        cfg = read_config(model_dir)
    report = {
        "model": args.model or f"{args.preset} (random weights)",
        "threads": args.threads,
        "calls": args.calls,
        "gflops": args.gflops,
        "runs": runs,
        "floors": floors(cfg, runs[0], args.gflops),
    }
    text = json.dumps(report, indent=2)
    print(text)
    print(table(report))
    if args.json_out:
        args.json_out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
