"""A tiny (untrained) CCRk model of the ten languages saved with its ONNX export: the base that the
language-acquisition tests (MLA, CL2CM) add languages to."""

from __future__ import annotations

from pathlib import Path

import torch

from model.export import export_onnx
from model.modeling import CCRkModel
from model.tokenization import train_tokenizer
from synthetic.catalogue import load_split
from synthetic.lexicons import LANGUAGES
from tests.tiny import tiny_config


def save_tiny_base(path: Path, catalogue: Path) -> Path:
    """The model in ``path``, its tokenizer trained on the ten languages' captions of ``catalogue`` (a
    synthetic split's jsonl); seeded, so every test module gets the same weights."""
    torch.manual_seed(0)
    model = CCRkModel(tiny_config(vocab_size=600, pooling="mean")).eval()
    texts = [t for r in load_split(catalogue) for lang in LANGUAGES for t in r.captions[lang]]
    model.save_pretrained(path, train_tokenizer(texts, 600, 32))
    export_onnx(model, path)
    return path
