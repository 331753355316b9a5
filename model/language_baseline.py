"""The comparison MLA argues against: fine-tuning the whole text tower (embeddings, text layers,
``text_proj``) of a copy of the model on the new language, with the original tokenizer (whose byte pieces
overflow ``max_length`` for Hangul, Arabic and Devanagari) and the same stages, data and steps as the acquirer
(``model.language_training.train_stages``).

It changes the model, so it writes a separate model directory (a new fingerprint: every index must be
rebuilt) and reports how far the native languages' embeddings drifted. For experiments only; nothing serves
it by default.

Measured on the demo model, Korean, 300 NLT + 150 LE steps on 2,000 synthetic items (test: 300 unseen items,
IR R@1): the acquirer reaches ko 0.912 with en/de/ja unchanged (0.900/0.902/0.883, bit-identical); the full
fine-tune reaches ko 0.067 / 0.283 / 0.297 at LR 1e-4 / 5e-4 / 2e-3 while en falls to 0.868 / 0.607 / 0.195.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from model.acquisition import freeze
from model.language_training import (
    LanguageData,
    LanguageTrainConfig,
    Log,
    Student,
    base_text_encoder,
    teacher_targets,
    tokens_per_text,
    train_stages,
)
from model.modeling import CCRkModel


@torch.no_grad()
def native_drift(
    before: CCRkModel, after: CCRkModel, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]
) -> float:
    """Mean ``1 - cos`` between two models' embeddings of the same native texts (0: unchanged)."""
    texts = list(texts[:512])
    if not texts:
        return 0.0
    _, a = teacher_targets(before, tokenizer, texts)
    _, b = teacher_targets(after, tokenizer, texts)
    return float((1 - (a * b).sum(dim=-1)).mean())


def full_finetune_baseline(
    model_dir: Path,
    data: LanguageData,
    cfg: LanguageTrainConfig,
    out: Path,
    log: Log = print,
    export: bool = True,
) -> dict[str, Any]:
    """Fine-tune embeddings, text layers and ``text_proj`` of a copy of the model (original tokenizer) with
    the same stages, data and steps as the acquirer; write it to ``out`` as a new model directory (its
    ``training.json`` holds the report, ``native_drift`` included). For comparison only."""
    from model.export import export_onnx
    from model.tokenization import load_tokenizer

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    base = freeze(CCRkModel.from_pretrained(model_dir))
    tokenizer = load_tokenizer(model_dir)
    torch.manual_seed(cfg.seed)
    student_model = copy.deepcopy(base)
    text = student_model.text_encoder
    trainable = [
        text.embeddings,
        *text.encoder.layer[: base.config.text.num_text_layers],
        student_model.text_proj,
    ]
    for module in trainable:
        for param in module.parameters():
            param.requires_grad_(True)
    student = Student(student_model, tokenizer, base.config.text.max_length, base_text_encoder(student_model))
    stages = train_stages(student, base, tokenizer, data, cfg, cfg.baseline_learning_rate, log)
    student_model = freeze(student_model)
    native_texts = [src for src, _ in data.pairs]
    config = student_model.config
    student_model.config = replace(
        config,
        name=f"{config.name}-finetuned-{data.lang}",
        languages=tuple(dict.fromkeys([*config.languages, data.lang])),
    )
    report = {
        "lang": data.lang,
        "method": "baseline: full fine-tuning of the text tower (embeddings, text layers, text_proj)",
        "base_model_dir": str(model_dir),
        **stages,
        "minutes": round((time.perf_counter() - start) / 60, 3),
        "parameters_trained": sum(p.numel() for m in trainable for p in m.parameters()),
        "native_drift": native_drift(base, student_model, tokenizer, native_texts),
        "tokens_per_text_shared": round(tokens_per_text(tokenizer, data.new_texts()[:2000]), 2),
        "data": {
            "pairs": len(data.pairs),
            "images": len(data.captions) if data.captions else 0,
            **data.sources,
        },
        "train_config": asdict(cfg),
    }
    student_model.save_pretrained(out, tokenizer)
    (Path(out) / "training.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", "utf-8")
    if export and (Path(model_dir) / "onnx").is_dir():
        export_onnx(student_model, Path(out))
    return report
