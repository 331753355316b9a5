"""Controlled comparisons between training objectives.

``kcl_vs_one2one``: train the 1-to-K objective (CCRk) and the 1-to-1 baseline with the same model config,
data, step budget and seeds, evaluate both on the same test split, and summarise per-language recall, mean
recall, MRV and mrv_std as mean and spread (sample standard deviation) over seeds.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from model.configs import CCRkConfig
from model.evaluation import RECALL_KS, evaluate
from model.modeling import CCRkModel
from model.preprocessing import ImagePreprocessor
from model.tokenization import load_tokenizer
from model.training import TrainConfig, Trainer
from model.training_data import load_captioned_images

OBJECTIVES = ("kcl", "one2one")


def _mean_sd(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def summarise(runs: dict[str, list[dict[str, Any]]], languages: Sequence[str]) -> dict[str, Any]:
    """Mean and spread over seeds of every figure, per objective, from per-run eval reports."""
    summary: dict[str, Any] = {}
    for objective, reports in runs.items():
        block: dict[str, Any] = {}
        for direction in ("IR", "TR"):
            scores = [r["dual"][direction] for r in reports]
            block[direction] = {
                "recall": {
                    f"R@{k}": {
                        lang: _mean_sd([s["recall"][f"R@{k}"][lang] for s in scores]) for lang in languages
                    }
                    for k in RECALL_KS
                },
                "mean_recall": _mean_sd([s["mean_recall"] for s in scores]),
                "mrv": _mean_sd([s["mrv"] for s in scores]),
                "mrv_std": _mean_sd([s["mrv_std"] for s in scores]),
            }
        summary[objective] = block
    return summary


def kcl_vs_one2one(
    model_config: CCRkConfig,
    base: TrainConfig,
    seeds: Sequence[int],
    test_split: Path,
    test_limit: int | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train and evaluate both objectives for every seed; runs go to ``base.output_dir/OBJECTIVE-seedN``."""
    preprocessor = ImagePreprocessor(model_config.vision)
    test = load_captioned_images(test_split, preprocessor, base.languages, test_limit, base.threads)
    runs: dict[str, list[dict[str, Any]]] = {o: [] for o in OBJECTIVES}
    for seed in seeds:
        for objective in OBJECTIVES:
            cfg = replace(
                base, objective=objective, seed=seed, output_dir=base.output_dir / f"{objective}-seed{seed}"
            )
            log(f"training {objective} seed {seed} -> {cfg.output_dir}")
            result = Trainer(model_config, cfg, log=log, show_progress=False).run()
            model = CCRkModel.from_pretrained(result.model_dir)
            report = evaluate(model, load_tokenizer(result.model_dir), test, preprocessor).report()
            report["train_seconds"] = result.seconds
            report["steps"] = result.steps
            (cfg.output_dir / "eval.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            runs[objective].append(report)
    return {
        "model": model_config.name,
        "seeds": list(seeds),
        "languages": list(test.languages),
        "n_test_images": len(test),
        "train": base.to_json(),
        "summary": summarise(runs, test.languages),
        "runs": runs,
    }


def format_comparison(result: dict[str, Any]) -> str:
    """A markdown table: per language IR R@1/5/10 (mean ± sd over seeds) per objective, then the
    summary figures for IR and TR."""
    langs = result["languages"]
    summary = result["summary"]
    lines = [
        "| objective | lang | IR R@1 | IR R@5 | IR R@10 | TR R@1 | TR R@5 | TR R@10 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def cell(block: dict[str, float]) -> str:
        return f"{block['mean'] * 100:.1f} ± {block['sd'] * 100:.1f}"

    for objective in OBJECTIVES:
        for lang in langs:
            cells = [
                cell(summary[objective][d]["recall"][f"R@{k}"][lang]) for d in ("IR", "TR") for k in RECALL_KS
            ]
            lines.append(f"| {objective} | {lang} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| objective | direction | mean recall | MRV | mrv_std |",
        "| --- | --- | --- | --- | --- |",
    ]
    for objective in OBJECTIVES:
        for direction in ("IR", "TR"):
            s = summary[objective][direction]
            lines.append(
                f"| {objective} | {direction} | {cell(s['mean_recall'])} | "
                f"{s['mrv']['mean']:.2f} ± {s['mrv']['sd']:.2f} | "
                f"{s['mrv_std']['mean']:.3f} ± {s['mrv_std']['sd']:.3f} |"
            )
    return "\n".join(lines)
