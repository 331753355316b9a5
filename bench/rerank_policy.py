"""Re-ranking where it pays: R@1 and fusion-encoder work of the adaptive re-rank policy
(``indexer.rerank_policy``) against re-ranking all 128 candidates, and the int8 fusion graph against fp32.

    python bench/rerank_policy.py --seed 7 --items 1000 --out bench/results/rerank-policy-DATE.json

A demo catalogue of ``--items`` products is drawn with ``--seed`` (one the model and the defaults never
used) and indexed by ``indexer.build`` with the demo model, which calibrates the version's policy on the
items' *first* captions. Held-out queries: each item's *second* caption in one language drawn per item
(``--queries`` of them). Each is searched as the service searches it (the built index, its tuned
parameters) and its 128-candidate shortlist re-ranked in full once; every policy's page then follows
exactly (a depth-d re-rank orders the first d candidates by their re-rank scores, the rest keep the dual
order), so all policies are compared on the same shortlists:
- dual (no re-rank), fixed depths 16 and 32, full (128), and the calibrated policy (``adaptive``);
- R@1/R@5/R@10 of the item's own product, top-1 agreement with the full re-rank, candidates scored per
  query (the fusion encoder's work) and its reduction against full; R@1 per query language;
- fusion time per query: ``score_pairs`` timed at 16, 32 and 128 candidates (median of ``--reps``,
  ``rerank_threads`` threads as the service), weighted by each policy's depths;
- int8 fusion graph (``onnx/fusion_scorer.int8.onnx``) on the same shortlists: R@1 of its full re-rank and
  of the policy, and its time, against fp32;
- caching the image side's key/value projections: the share of the fusion's multiply-adds they are,
  from the model's shapes (not built: see the report's note).
Prints JSON, then a table; not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnxruntime as ort  # noqa: E402

from ccrk_settings import DEFAULT_MODEL_DIR, Settings  # noqa: E402
from indexer.build import build  # noqa: E402
from indexer.rerank_policy import RerankPolicy, full_reranks  # noqa: E402
from model.reranking import rerank_scores  # noqa: E402
from model.runtime import Encoder, load_encoder  # noqa: E402
from store.version.reader import IndexVersion  # noqa: E402

K = 128
FIXED = (0, 16, 32, K)


def page_rows(rows: np.ndarray, combined: np.ndarray, depth: int, n: int = 10) -> np.ndarray:
    """The first ``n`` rows of one shortlist with its first ``depth`` candidates re-ranked."""
    if depth <= 0:
        return rows[:n]
    order = np.argsort(-combined[:depth], kind="stable")
    return np.concatenate([rows[:depth][order], rows[depth:]])[:n]


def evaluate(
    depths: np.ndarray, rows: np.ndarray, combined: np.ndarray, gold: np.ndarray, full_top: np.ndarray
) -> dict[str, Any]:
    pages = np.stack([page_rows(r, c, int(d)) for r, c, d in zip(rows, combined, depths, strict=True)])
    hit = pages == gold[:, None]
    return {
        "r1": round(100 * float(hit[:, 0].mean()), 2),
        "r5": round(100 * float(hit[:, :5].any(1).mean()), 2),
        "r10": round(100 * float(hit[:, :10].any(1).mean()), 2),
        "top1_agreement_with_full": round(100 * float(np.mean(pages[:, 0] == full_top)), 2),
        "mean_candidates": round(float(depths.mean()), 2),
        "work_reduction_x": round(K / float(depths.mean()), 1) if depths.mean() else None,
        "share_by_depth": {
            str(d): round(float(np.mean(depths == d)), 4) for d in sorted(set(depths.tolist()))
        },
    }


def fusion_ms(encoder: Encoder, text: str, tokens: np.ndarray, reps: int) -> dict[int, float]:
    """Median ms of one ``score_pairs`` call at each depth."""
    query = encoder.encode_text([text]).row(0)
    out = {}
    for depth in (16, 32, K):
        encoder.score_pairs(query, tokens[:depth])  # warm-up
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            encoder.score_pairs(query, tokens[:depth])
            samples.append((time.perf_counter() - start) * 1000)
        out[depth] = round(statistics.median(samples), 3)
    return out


def mean_fusion_ms(depths: np.ndarray, per_depth: dict[int, float]) -> float:
    return round(float(np.mean([per_depth.get(int(d), 0.0) if d else 0.0 for d in depths])), 3)


def kv_share(encoder: Encoder, mean_tokens: float, width: int, image_tokens: int) -> dict[str, Any]:
    """Multiply-adds per (query, candidate) pair of the fusion layers, and the image-side key/value
    projections' share of them (what a per-candidate cache of K/V would save; the store would hold 2 x
    layers x tokens x hidden values per item instead of tokens x width)."""
    t = encoder.config.text
    h, inter, layers, lq = t.hidden_size, t.intermediate_size, t.num_fusion_layers, mean_tokens
    self_attn = 4 * lq * h * h + 2 * lq * lq * h
    cross_q_o = 2 * lq * h * h + 2 * lq * image_tokens * h
    cross_kv = 2 * image_tokens * width * h
    ffn = 2 * lq * h * inter
    per_layer = self_attn + cross_q_o + cross_kv + ffn
    return {
        "fusion_layers": layers,
        "mean_query_tokens": round(mean_tokens, 1),
        "image_tokens": image_tokens,
        "kv_share_of_fusion_macs": round(cross_kv / per_layer, 3),
        "store_values_per_item_now": image_tokens * width,
        "store_values_per_item_with_kv_cache": 2 * layers * image_tokens * h,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=7, help="catalogue seed (hidden from the calibration)")
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=1000, help="held-out queries (one per item at most)")
    parser.add_argument("--reps", type=int, default=30, help="timed fusion calls per depth")
    parser.add_argument("--skip-int8", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from synthetic.catalogue import load_split
    from synthetic.synth import SynthConfig, generate_catalogue

    settings = Settings()
    threads, fusion_threads = 1, settings.rerank_threads
    result: dict[str, Any] = {
        "benchmark": "rerank_policy",
        "command": "python bench/rerank_policy.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "seed": args.seed,
        "items": args.items,
        "rerank_k": K,
        "fusion_threads": fusion_threads,
    }
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        config = SynthConfig(seed=args.seed, n_train=0, n_val=0, n_test=args.items)
        generate_catalogue(tmp / "cat", config, workers=1)
        build_settings = Settings(
            model_dir=DEFAULT_MODEL_DIR, index_root=tmp / "idx", threads=2, index_workers=1
        )
        started = time.perf_counter()
        build("bench", [tmp / "cat" / "test.jsonl"], settings=build_settings)
        result["build_seconds"] = round(time.perf_counter() - started, 1)
        records = load_split(tmp / "cat" / "test.jsonl")
        rng = np.random.default_rng(args.seed + 1000)
        langs = sorted(records[0].captions)
        picks = rng.permutation(len(records))[: args.queries]
        query_langs = [langs[int(rng.integers(len(langs)))] for _ in picks]
        texts = [records[i].captions[lang][1] for i, lang in zip(picks, query_langs, strict=True)]
        fp32 = load_encoder(DEFAULT_MODEL_DIR, threads=threads, fusion_threads=fusion_threads)
        with IndexVersion.open(build_settings.index_root, "bench") as index:
            policy = RerankPolicy.from_dict(index.manifest.rerank["policy"])
            result["policy"] = policy.to_dict()
            result["build_seconds_note"] = (
                "includes the policy's calibration (full re-ranks of caption queries)"
            )
            gold = np.array([index.row_of(records[i].id) for i in picks])
            started = time.perf_counter()
            scores, rows, combined = full_reranks(index, fp32, texts, K)
            result["full_pass_seconds"] = round(time.perf_counter() - started, 1)
            sample_tokens = index.rerank_tokens(rows[0])
            int8_combined = None
            if not args.skip_int8:
                int8 = load_encoder(DEFAULT_MODEL_DIR, threads=threads, fusion_threads=fusion_threads)
                # the int8 fusion graph alone (text side stays fp32), in place of the lazily loaded fp32 one
                int8._fusion_session = ort.InferenceSession(
                    str(DEFAULT_MODEL_DIR / "onnx" / "fusion_scorer.int8.onnx"),
                    int8._fusion_args[1],
                    providers=["CPUExecutionProvider"],
                )
                int8_combined = np.full_like(combined, np.nan)
                for i, text in enumerate(texts):
                    keep = rows[i] >= 0
                    query = fp32.encode_text([text]).row(0)
                    match = int8.score_pairs(query, index.rerank_tokens(rows[i][keep]))
                    int8_combined[i, keep] = rerank_scores(
                        scores[i][keep], match.astype(np.float32), fp32.temperature
                    )
        n = len(texts)
        filled = np.where(np.isnan(combined), -np.inf, combined)
        full_top = rows[np.arange(n), np.argmax(filled, axis=1)]
        adaptive = np.array([policy.depth(s[np.isfinite(s)], K) for s in scores])
        policies = {
            "dual (0)": np.zeros(n, int),
            "fixed 16": np.full(n, 16),
            "fixed 32": np.full(n, 32),
            "full (128)": np.full(n, K),
            "adaptive": adaptive,
        }
        rows_out = {name: evaluate(d, rows, combined, gold, full_top) for name, d in policies.items()}
        per_depth = fusion_ms(fp32, texts[0], sample_tokens, args.reps)
        for name, d in policies.items():
            rows_out[name]["fusion_ms_per_query"] = mean_fusion_ms(d, per_depth)
        result["held_out_queries"] = n
        by_lang = np.array(query_langs)
        per_language = {}
        for lang in langs:
            mask = by_lang == lang
            per_language[lang] = {
                name: evaluate(d[mask], rows[mask], combined[mask], gold[mask], full_top[mask])["r1"]
                for name, d in policies.items()
                if name in ("dual (0)", "full (128)", "adaptive")
            } | {"queries": int(mask.sum())}
        result["r1_by_language"] = per_language
        result["max_language_r1_change_adaptive_vs_full"] = round(
            max(abs(v["adaptive"] - v["full (128)"]) for v in per_language.values()), 2
        )
        result["policies"] = rows_out
        result["fusion_ms_by_depth_fp32"] = per_depth
        if int8_combined is not None:
            int8_per_depth = fusion_ms(int8, texts[0], sample_tokens, args.reps)
            result["int8_fusion"] = {
                "fusion_ms_by_depth": int8_per_depth,
                "full (128)": {
                    **evaluate(policies["full (128)"], rows, int8_combined, gold, full_top),
                    "fusion_ms_per_query": mean_fusion_ms(policies["full (128)"], int8_per_depth),
                },
                "adaptive": {
                    **evaluate(adaptive, rows, int8_combined, gold, full_top),
                    "fusion_ms_per_query": mean_fusion_ms(adaptive, int8_per_depth),
                },
            }
        mask_tokens = float(np.mean([fp32.encode_text([t]).mask.sum() for t in texts[:200]]))
        result["kv_cache_estimate"] = kv_share(
            fp32, mask_tokens, sample_tokens.shape[2], sample_tokens.shape[1]
        )
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(
        f"\n{n} held-out queries, demo catalogue seed {args.seed}, {args.items} items; fusion "
        f"{fusion_threads} threads\n"
    )
    print("| policy | R@1 | R@5 | R@10 | top-1 = full | candidates/query | work cut | fusion ms/query |")
    print("|---|---|---|---|---|---|---|---|")
    table = dict(rows_out)
    if "int8_fusion" in result:
        table |= {f"int8 {k}": v for k, v in result["int8_fusion"].items() if k != "fusion_ms_by_depth"}
    for name, r in table.items():
        cut = f"{r['work_reduction_x']}x" if r["work_reduction_x"] else "no fusion"
        print(
            f"| {name} | {r['r1']} | {r['r5']} | {r['r10']} | {r['top1_agreement_with_full']} | "
            f"{r['mean_candidates']} | {cut} | {r['fusion_ms_per_query']} |"
        )


if __name__ == "__main__":
    main()
