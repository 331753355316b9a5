"""``add_language_noise``: what machine-translation errors cost when a language is added to a frozen model,
and whether CL2CM's cross-lingual knowledge transfer (``model.cl2cm``) makes up for them, against MLA.

For every added language, noise rate and seed, the train split's captions in that language are corrupted
(``synthetic.noise.corrupt_records``: exactly ``rate`` of the caption slots, seeded by the run's seed, the
same slot carrying the same error in the NLT pairs and the LE captions); then one acquirer per objective
(``mla``, ``cl2cm``, ``mla+cl2cm``) is trained on the same noisy data with the same steps, batch and seed.
Each is evaluated on the **clean** test split (held-out attribute combinations): text->image (IR) and
image->text (TR) recall of the new language, and MRV over all the model's languages plus the new one (the
native columns are the frozen model's, computed once: an acquirer cannot change them). Training seconds and
parameters added come from each run's report. Summaries are mean and sample standard deviation over seeds.

The frozen images are embedded once per language (``LanguageData.image_embeds``), since every run trains
against the same frozen image embeddings.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.language_training import (
    OBJECTIVES,
    LanguageData,
    LanguageTrainConfig,
    image_embeds,
    teacher_targets,
    train_acquirer,
)
from model.metrics import mrv, mrv_std, ranks_from_scores
from model.modeling import CCRkModel
from model.parallel_corpus import pairs_from_catalogue
from model.preprocessing import ImagePreprocessor
from model.tokenization import load_tokenizer, tokenize
from model.training_data import CaptionedImages, load_captioned_images
from store.version.manifest import model_fingerprint
from synthetic.catalogue import CatalogueRecord, load_split
from synthetic.noise import corrupt_records, summarise

Log = Callable[[str], None]
KS = (1, 5, 10)


def _mean_sd(values: Sequence[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


def _ranks(texts: np.ndarray, images: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
    """(IR ranks (N * C,), TR ranks (N,)) of one language; texts in image-major order (N * C, D)."""
    n = images.shape[0]
    scores = texts @ images.T
    ir = ranks_from_scores(scores, np.repeat(np.arange(n), c))
    tr = ranks_from_scores(scores.T, np.arange(n * c).reshape(n, c))
    return ir, tr


class CleanTest:
    """The clean test split, its frozen image embeddings and the native languages' rank columns."""

    def __init__(self, base: CCRkModel, base_tokenizer: Any, data: CaptionedImages, native: Sequence[str]):
        self.data, self.native = data, tuple(native)
        self.c = min(len(caps[lang]) for caps in data.captions for lang in data.languages)
        with torch.no_grad():
            self.images = image_embeds(base, data).numpy()
        ir_cols, tr_cols = [], []
        for lang in self.native:
            _, embeds = teacher_targets(base, base_tokenizer, self.texts(lang))
            ir, tr = _ranks(embeds.numpy(), self.images, self.c)
            ir_cols.append(ir)
            tr_cols.append(tr)
        self.native_ir = np.stack(ir_cols, axis=1)
        self.native_tr = np.stack(tr_cols, axis=1)

    def texts(self, lang: str) -> list[str]:
        return [caps[lang][j] for caps in self.data.captions for j in range(self.c)]

    @torch.no_grad()
    def evaluate(self, acquirer: Any, tokenizer: Any, lang: str) -> dict[str, Any]:
        texts = self.texts(lang)
        parts = []
        for start in range(0, len(texts), 256):
            batch = tokenize(tokenizer, texts[start : start + 256], acquirer.config.max_length)
            parts.append(acquirer(batch["input_ids"], batch["attention_mask"])[2])
        ir, tr = _ranks(torch.cat(parts).numpy(), self.images, self.c)
        all_ir = np.concatenate([self.native_ir, ir[:, None]], axis=1)
        all_tr = np.concatenate([self.native_tr, tr[:, None]], axis=1)
        return {
            "IR": {f"R@{k}": float((ir < k).mean()) for k in KS},
            "TR": {f"R@{k}": float((tr < k).mean()) for k in KS},
            "IR_native_mean_R@1": float((self.native_ir < 1).mean()),
            "mrv_IR": mrv(all_ir),
            "mrv_TR": mrv(all_tr),
            "mrv_std_IR": mrv_std(all_ir),
            "mrv_std_TR": mrv_std(all_tr),
        }


def _language_data(
    lang: str,
    native: str,
    records: list[CatalogueRecord],
    pixels: torch.Tensor,
    images: torch.Tensor,
    item_keys: list[str],
    noise: float,
    seed: int,
) -> tuple[LanguageData, dict[str, Any]]:
    noisy, log = corrupt_records(records, lang, native, noise, seed)
    pairs = pairs_from_catalogue(noisy, 4, seed, source=native, target=lang)
    captions = CaptionedImages(
        ids=[r.id for r in noisy],
        pixels=pixels,
        captions=[{lang: list(r.captions[lang])} for r in noisy],
        languages=(lang,),
        item_keys=item_keys,
    )
    data = LanguageData(
        lang=lang,
        native=(native,),
        pairs=pairs,
        captions=captions,
        native_captions=[list(r.captions[native]) for r in noisy],
        image_embeds=images,
        sources={"noise": f"{noise:.2f}", "noise_seed": str(seed)},
    )
    return data, summarise(log)


def add_language_noise(
    model_dir: Path,
    catalogue: Path,
    languages: Sequence[str],
    noise_levels: Sequence[float],
    seeds: Sequence[int],
    train: LanguageTrainConfig,
    objectives: Sequence[str] = OBJECTIVES,
    native: str = "en",
    train_limit: int | None = None,
    test_limit: int | None = None,
    log: Log = print,
    eval_split: str = "test",
) -> dict[str, Any]:
    """Run the grid (language x noise x seed x objective); the result holds every run and the summary."""
    unknown = [o for o in objectives if o not in OBJECTIVES]
    if unknown:
        raise ValueError(f"unknown objectives {unknown}; one of {', '.join(OBJECTIVES)}")
    if train.threads:
        torch.set_num_threads(train.threads)
    base = CCRkModel.from_pretrained(model_dir).eval()
    for param in base.parameters():
        param.requires_grad_(False)
    base_tokenizer = load_tokenizer(model_dir)
    fingerprint = model_fingerprint(model_dir)
    preprocessor = ImagePreprocessor(base.config.vision)
    threads = train.threads or 1
    native_langs = tuple(base.config.languages)
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    for lang in languages:
        test = load_captioned_images(
            catalogue / f"{eval_split}.jsonl", preprocessor, (*native_langs, lang), test_limit, threads
        )
        clean_test = CleanTest(base, base_tokenizer, test, native_langs)
        train_records = [
            r for r in load_split(catalogue / "train.jsonl")[:train_limit] if r.captions.get(lang)
        ]
        train_images = load_captioned_images(
            catalogue / "train.jsonl", preprocessor, (lang,), train_limit, threads
        )
        if train_images.ids != [r.id for r in train_records]:
            raise ValueError(f"{catalogue}/train.jsonl: every record needs captions in {lang!r}")
        with torch.no_grad():
            images = image_embeds(base, train_images)
        for noise in noise_levels:
            for seed in seeds:
                data, damage = _language_data(
                    lang,
                    native,
                    train_records,
                    train_images.pixels,
                    images,
                    train_images.item_keys,
                    noise,
                    seed,
                )
                for objective in objectives:
                    cfg = replace(train, objective=objective, seed=seed)
                    start = time.perf_counter()
                    result = train_acquirer(base, base_tokenizer, data, cfg, fingerprint, log=lambda _: None)
                    seconds = time.perf_counter() - start
                    scores = clean_test.evaluate(result.acquirer, result.tokenizer, lang)
                    stage_seconds = {
                        name: result.report[name]["seconds"]
                        for name in ("nlt", "cl", "le")
                        if name in result.report
                    }
                    run = {
                        "lang": lang,
                        "noise": noise,
                        "seed": seed,
                        "objective": objective,
                        **scores,
                        "train_seconds": round(seconds, 2),
                        "stage_seconds": stage_seconds,
                        "parameters_added": result.report["parameters_added"],
                        "final_losses": {
                            name: result.report[name]["losses"][-1]
                            for name in ("nlt", "cl", "le")
                            if name in result.report
                        },
                        "damage": damage,
                    }
                    runs.append(run)
                    log(
                        f"{lang} noise {noise:.0%} seed {seed} {objective}: IR R@1 {scores['IR']['R@1']:.3f} "
                        f"TR R@1 {scores['TR']['R@1']:.3f} MRV IR {scores['mrv_IR']:.2f} ({seconds:.0f} s, "
                        f"{time.perf_counter() - started:.0f} s in all)"
                    )
    return {
        "experiment": "add-language-noise",
        "model": {"dir": str(model_dir), "fingerprint": fingerprint, "name": base.config.name},
        "native_languages": list(native_langs),
        "languages": list(languages),
        "noise_levels": list(noise_levels),
        "seeds": list(seeds),
        "objectives": list(objectives),
        "eval_split": eval_split,
        "n_test_images": len(clean_test.data) if languages else 0,
        "train": asdict(train),
        "train_limit": train_limit,
        "seconds": round(time.perf_counter() - started, 1),
        "summary": summarise_runs(runs),
        "runs": runs,
    }


def summarise_runs(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and sd over seeds per (language, noise, objective)."""
    groups: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["lang"], run["noise"], run["objective"]), []).append(run)
    rows = []
    for (lang, noise, objective), group in groups.items():
        rows.append(
            {
                "lang": lang,
                "noise": noise,
                "objective": objective,
                "seeds": [r["seed"] for r in group],
                "IR_R@1": _mean_sd([r["IR"]["R@1"] for r in group]),
                "IR_R@5": _mean_sd([r["IR"]["R@5"] for r in group]),
                "TR_R@1": _mean_sd([r["TR"]["R@1"] for r in group]),
                "mrv_IR": _mean_sd([r["mrv_IR"] for r in group]),
                "mrv_TR": _mean_sd([r["mrv_TR"] for r in group]),
                "train_seconds": _mean_sd([r["train_seconds"] for r in group]),
                "parameters_added": group[0]["parameters_added"],
                "corrupted_share": _mean_sd([r["damage"]["rate"] for r in group]),
            }
        )
    return rows


def format_noise_table(result: dict[str, Any]) -> str:
    """Markdown: per language and noise, each objective's IR R@1, TR R@1, MRV (IR, all languages) and
    training seconds, mean ± sd over seeds."""

    def pct(block: dict[str, float]) -> str:
        return f"{100 * block['mean']:.1f} ± {100 * block['sd']:.1f}"

    lines = [
        "| lang | noise | objective | IR R@1 (%) | TR R@1 (%) | IR R@5 (%) | MRV IR | MRV TR | train s "
        "| params |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["summary"]:
        lines.append(
            f"| {row['lang']} | {row['noise']:.0%} | {row['objective']} | {pct(row['IR_R@1'])} | "
            f"{pct(row['TR_R@1'])} | {pct(row['IR_R@5'])} | "
            f"{row['mrv_IR']['mean']:.2f} ± {row['mrv_IR']['sd']:.2f} | "
            f"{row['mrv_TR']['mean']:.2f} ± {row['mrv_TR']['sd']:.2f} | "
            f"{row['train_seconds']['mean']:.0f} ± {row['train_seconds']['sd']:.0f} | "
            f"{row['parameters_added']:,} |"
        )
    return "\n".join(lines)
