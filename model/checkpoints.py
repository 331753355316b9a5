"""A training run's directory on disk: ``checkpoints/step-N/`` (a model directory plus the trainer's state),
each written under a temporary name and renamed once complete, the newest kept ones rotated; the newest
complete checkpoint to resume from; and the final model directory ``model/`` with its ``training.json``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from model.modeling import CCRkModel

STATE_FILE = "trainer_state.pt"
CHECKPOINTS = "checkpoints"
FINAL_MODEL = "model"


def _step_of(path: Path) -> int:
    return int(path.name.split("-")[1])


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint (one whose trainer state was written), or None."""
    ckpts = sorted(
        (p for p in (output_dir / CHECKPOINTS).glob("step-*") if (p / STATE_FILE).is_file()), key=_step_of
    )
    return ckpts[-1] if ckpts else None


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint (optimizer, scheduler, scaler, step, history, configs)."""
    return torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=True)


def save_checkpoint(
    output_dir: Path,
    model: CCRkModel,
    tokenizer: PreTrainedTokenizerBase,
    state: dict[str, Any],
    step: int,
    keep: int,
) -> None:
    """Write ``checkpoints/step-{step}`` and keep only the newest ``keep`` checkpoints."""
    ckpt_root = output_dir / CHECKPOINTS
    final = ckpt_root / f"step-{step}"
    tmp = ckpt_root / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, tokenizer)
    torch.save(state, tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)  # a checkpoint directory exists only once complete
    ckpts = sorted((p for p in ckpt_root.glob("step-*")), key=_step_of)
    for old in ckpts[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def save_final_model(
    output_dir: Path, model: CCRkModel, tokenizer: PreTrainedTokenizerBase, training: dict[str, Any]
) -> Path:
    """Write the trained model (moved to the CPU, in eval mode) to ``model/`` with ``training.json``
    (``training``: the train config and the history), replacing any earlier one only once complete."""
    model_dir = output_dir / FINAL_MODEL
    tmp = output_dir / ".tmp-model"
    shutil.rmtree(tmp, ignore_errors=True)
    model.eval()
    model.cpu().save_pretrained(tmp, tokenizer)
    (tmp / "training.json").write_text(json.dumps(training, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(model_dir, ignore_errors=True)
    tmp.rename(model_dir)
    return model_dir
