"""Training CCRk: 1-to-K (or 1-to-1) contrastive learning plus MITM with hard samples and CMLM, optionally
MURAL's translation-pair term; checkpoints every epoch (and every N steps) and resumes after interruption.

This module owns a run's options (``TrainConfig``) and its loop (``Trainer``, in named steps). What one step
computes (losses, parameter groups, LR schedule) is ``model.training_step``; the run directory (checkpoints,
the final model) is ``model.checkpoints``.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from model.checkpoints import latest_checkpoint, load_state, save_checkpoint, save_final_model
from model.configs import CCRkConfig
from model.evaluation import evaluate
from model.modeling import CCRkModel, CheckpointError
from model.parallel_corpus import ParallelCorpus, ParallelCorpusError
from model.preprocessing import ImagePreprocessor
from model.tokenization import load_tokenizer, train_tokenizer
from model.training_data import (
    CaptionedImages,
    epoch_batches,
    iter_caption_corpus,
    load_captioned_images,
    make_batch,
)
from model.training_step import Objective, lr_schedule, param_groups, training_step


class TrainingError(RuntimeError):
    """Training cannot start or continue (bad data, incompatible checkpoint, ...)."""


@dataclass
class TrainConfig:
    """Options of one training run.

    Attributes:
        data_dir: a catalogue folder holding ``train.jsonl`` (and ``val.jsonl`` for per-epoch validation).
        output_dir: receives ``checkpoints/step-N/`` and the final model directory ``model/``.
        objective: ``kcl`` (1-to-K, CCRk) or ``one2one`` (one random-language caption per image per step).
        itm_weight, mlm_weight: weights of MITM and CMLM; 0 switches a task off.
        translation_weight: weight of the MURAL text-text term; needs ``parallel_data``.
        train_limit, val_limit: use only the first N records (tests, quick runs).
        max_steps: stop after this many optimizer steps in total (overrides epochs when smaller).
        save_every_steps: also checkpoint inside an epoch, so a kill loses at most this many steps.
        device: ``auto`` picks CUDA when present; AMP is used on CUDA only.
        init_from: a model directory whose weights the run starts from (fine-tuning, e.g. the default
            model or a converted official checkpoint); its tokenizer is used unless ``tokenizer_dir`` is set.
    """

    data_dir: Path
    output_dir: Path
    objective: Objective = "kcl"
    epochs: int = 10
    batch_size: int = 64
    learning_rate: float = 1e-3
    weight_decay: float = 0.02
    warmup_steps: int = 100
    seed: int = 0
    itm_weight: float = 1.0
    mlm_weight: float = 1.0
    mlm_probability: float = 0.15
    translation_weight: float = 0.0
    parallel_data: Path | None = None
    languages: tuple[str, ...] | None = None
    train_limit: int | None = None
    val_limit: int | None = 500
    max_steps: int | None = None
    save_every_steps: int | None = None
    keep_checkpoints: int = 2
    device: str = "auto"
    amp: bool = True
    threads: int = 2
    tokenizer_dir: Path | None = None
    init_from: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), default=str))


@dataclass
class TrainResult:
    model_dir: Path
    steps: int
    epochs_completed: int
    seconds: float
    samples_per_second: float
    history: list[dict[str, Any]] = field(default_factory=list)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TrainingError(f"device {name!r} requested but CUDA is not available")
    return torch.device(name)


@dataclass
class _Run:
    """What the steps of one ``Trainer.run`` share: data, model, optimisation state and progress."""

    train: CaptionedImages
    val: CaptionedImages | None
    tokenizer: PreTrainedTokenizerBase
    parallel: ParallelCorpus | None
    model: CCRkModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    steps_per_epoch: int
    total_steps: int
    use_amp: bool
    amp_dtype: torch.dtype
    initial: CCRkModel | None  # the ``init_from`` weights, until ``_resume`` has used them
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    samples_seen: int = 0
    start_time: float = 0.0


class Trainer:
    """Runs one training configuration; ``run()`` resumes from the newest complete checkpoint.

    ``run`` is a sequence of named steps: ``_setup`` (data, tokenizer, model, optimizer), ``_resume``
    (initial weights, or the newest checkpoint), ``_train_epoch`` per epoch (``_train_step`` per batch,
    ``_maybe_checkpoint`` inside the epoch, ``_validate`` and a checkpoint at its end), then ``_export``.
    """

    def __init__(
        self,
        model_config: CCRkConfig,
        cfg: TrainConfig,
        log: Callable[[str], None] = print,
        show_progress: bool = True,
    ) -> None:
        self.model_config = model_config
        self.cfg = cfg
        self.log = log
        self.show_progress = show_progress
        self.device = resolve_device(cfg.device)
        self.preprocessor = ImagePreprocessor(model_config.vision)

    def run(self) -> TrainResult:
        run = self._setup()
        self._resume(run)
        run.start_time = time.perf_counter()
        epoch = run.step // run.steps_per_epoch
        while epoch < self.cfg.epochs and run.step < run.total_steps:
            self._train_epoch(run, epoch)
            epoch += 1
        elapsed = time.perf_counter() - run.start_time
        model_dir = self._export(run)
        return TrainResult(
            model_dir, run.step, epoch, elapsed, run.samples_seen / max(elapsed, 1e-9), run.history
        )

    def _setup(self) -> _Run:
        """Everything a run needs before its first step; the ``init_from`` weights are checked first."""
        cfg = self.cfg
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, cfg.threads))
        if cfg.translation_weight > 0 and cfg.parallel_data is None:
            raise TrainingError(
                "translation_weight > 0 needs parallel_data (a TSV or jsonl of translation pairs)"
            )
        try:
            parallel = ParallelCorpus.load(cfg.parallel_data) if cfg.parallel_data else None
        except ParallelCorpusError as exc:
            raise TrainingError(str(exc)) from exc
        # Checked first: a wrong --init must fail before any work, and before its tokenizer is read.
        initial = self._initial_weights(cfg.init_from) if cfg.init_from is not None else None
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
        train, val = self._load_data()
        tokenizer = self._tokenizer(train)

        torch.manual_seed(cfg.seed)  # the initial weights
        model = CCRkModel(self.model_config).to(self.device)
        optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate)
        steps_per_epoch = len(epoch_batches(len(train), cfg.batch_size, cfg.seed, 0))
        total_steps = steps_per_epoch * cfg.epochs
        if cfg.max_steps is not None:
            total_steps = min(total_steps, cfg.max_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(cfg.warmup_steps, total_steps))
        use_amp = cfg.amp and self.device.type == "cuda"
        amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16
        scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)
        return _Run(
            train=train,
            val=val,
            tokenizer=tokenizer,
            parallel=parallel,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            steps_per_epoch=steps_per_epoch,
            total_steps=total_steps,
            use_amp=use_amp,
            amp_dtype=amp_dtype,
            initial=initial,
        )

    def _resume(self, run: _Run) -> None:
        """Continue from the newest complete checkpoint (weights, optimizer, scheduler, scaler, step,
        history); without one, start from the ``init_from`` weights when given."""
        latest = latest_checkpoint(self.cfg.output_dir)
        if latest is None and run.initial is not None:
            run.model.load_state_dict(run.initial.state_dict())
            self.log(f"starting from the weights of {self.cfg.init_from}")
        run.initial = None  # used or superseded: not held beside the model (and a checkpoint's copy)
        if latest is None:
            return
        state = load_state(latest)
        if state.get("model_config") != self.model_config.to_dict():
            raise TrainingError(
                f"checkpoint {latest} was trained with another model config; use a new output dir"
            )
        loaded = CCRkModel.from_pretrained(latest, map_location=self.device)
        run.model.load_state_dict(loaded.state_dict())
        run.optimizer.load_state_dict(state["optimizer"])
        run.scheduler.load_state_dict(state["scheduler"])
        run.scaler.load_state_dict(state["scaler"])
        run.step, run.history = int(state["step"]), list(state["history"])
        self.log(f"resumed from {latest} at step {run.step}")

    def _train_epoch(self, run: _Run, epoch: int) -> None:
        """The rest of epoch ``epoch`` (all of it unless resumed inside it), its record in the history
        (mean losses, validation) and its checkpoint."""
        batches = epoch_batches(len(run.train), self.cfg.batch_size, self.cfg.seed, epoch)
        skip = run.step - epoch * run.steps_per_epoch
        progress = self._progress(len(batches), skip, epoch)
        run.model.train()
        epoch_losses: dict[str, float] = {}
        for index in batches[skip:]:
            if run.step >= run.total_steps:
                break
            floats = self._train_step(run, index)
            run.samples_seen += len(index)
            for key, value in floats.items():
                epoch_losses[key] = epoch_losses.get(key, 0.0) + value
            elapsed = time.perf_counter() - run.start_time
            progress.update(1)
            progress.set_postfix(
                loss=f"{floats['total']:.3f}", sps=f"{run.samples_seen / max(elapsed, 1e-9):.1f}"
            )
            self._maybe_checkpoint(run)
        progress.close()
        done_in_epoch = run.step - epoch * run.steps_per_epoch - skip
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "step": run.step,
            "loss": {k: v / max(1, done_in_epoch) for k, v in epoch_losses.items()},
            "seconds": time.perf_counter() - run.start_time,
        }
        if run.val is not None:
            self._validate(run, run.val, record)
        run.history.append(record)
        self._checkpoint(run)

    def _train_step(self, run: _Run, index: list[int]) -> dict[str, float]:
        """One optimizer step on the images ``index`` (AMP on CUDA); the step's losses."""
        cfg, step = self.cfg, run.step
        # Per-step seeds make sampling independent of where a resumed run restarted.
        rng = random.Random(f"{cfg.seed}:{step}")
        generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        torch.manual_seed(cfg.seed * 1_000_003 + step)  # dropout masks, also on CUDA
        max_length = self.model_config.text.max_length
        batch = make_batch(run.train, index, run.tokenizer, self.preprocessor, max_length, rng)
        batch = batch.to(self.device)
        pairs = None
        if run.parallel is not None and cfg.translation_weight > 0:
            pairs = run.parallel.batch(run.tokenizer, cfg.batch_size, max_length, rng)
            pairs = tuple({k: v.to(self.device) for k, v in p.items()} for p in pairs)
        autocast = torch.autocast("cuda", dtype=run.amp_dtype) if run.use_amp else nullcontext()
        with autocast:
            losses = training_step(run.model, batch, cfg.objective, cfg, run.tokenizer, generator, pairs)
        run.optimizer.zero_grad(set_to_none=True)
        run.scaler.scale(losses.total).backward()
        run.scaler.unscale_(run.optimizer)
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), 5.0)
        run.scaler.step(run.optimizer)
        run.scaler.update()
        run.scheduler.step()
        run.step += 1
        return losses.as_floats()

    def _maybe_checkpoint(self, run: _Run) -> None:
        """Every ``save_every_steps`` inside an epoch (an epoch's end has its own checkpoint)."""
        every = self.cfg.save_every_steps
        if every and run.step % every == 0 and run.step % run.steps_per_epoch:
            self._checkpoint(run)

    def _validate(self, run: _Run, val: CaptionedImages, record: dict[str, Any]) -> None:
        """Dual-encoder IR mean recall and MRV on the validation split: into the epoch's record, logged."""
        result = evaluate(run.model, run.tokenizer, val, self.preprocessor, device=self.device)
        scores = result.report()["dual"]
        record["val_ir_mean_recall"] = scores["IR"]["mean_recall"]
        record["val_ir_mrv"] = scores["IR"]["mrv"]
        self.log(
            f"epoch {record['epoch']}: loss {record['loss'].get('total', float('nan')):.4f}  "
            f"val IR mean recall {record['val_ir_mean_recall'] * 100:.2f}  "
            f"MRV {record['val_ir_mrv']:.2f}"
        )

    def _checkpoint(self, run: _Run) -> None:
        """``checkpoints/step-N``: the weights and all a resumed run needs to continue bit for bit."""
        state = {
            "optimizer": run.optimizer.state_dict(),
            "scheduler": run.scheduler.state_dict(),
            "scaler": run.scaler.state_dict(),
            "step": run.step,
            "history": run.history,
            "model_config": self.model_config.to_dict(),
            "train_config": self.cfg.to_json(),
        }
        save_checkpoint(
            self.cfg.output_dir, run.model, run.tokenizer, state, run.step, self.cfg.keep_checkpoints
        )

    def _export(self, run: _Run) -> Path:
        """The final model directory, with the train config and history in its ``training.json``."""
        training = {"train_config": self.cfg.to_json(), "history": run.history}
        return save_final_model(self.cfg.output_dir, run.model, run.tokenizer, training)

    def _load_data(self) -> tuple[CaptionedImages, CaptionedImages | None]:
        train_path = self.cfg.data_dir / "train.jsonl"
        if not train_path.is_file():
            raise TrainingError(
                f"no training split: {train_path} not found (make one with `ccrk data synth`)"
            )
        langs = self.cfg.languages
        train = load_captioned_images(
            train_path, self.preprocessor, langs, self.cfg.train_limit, self.cfg.threads
        )
        if len(train) < self.cfg.batch_size:
            raise TrainingError(
                f"{train_path} has {len(train)} records, fewer than batch_size {self.cfg.batch_size}"
            )
        val_path = self.cfg.data_dir / "val.jsonl"
        val = None
        if val_path.is_file() and self.cfg.val_limit != 0:
            val = load_captioned_images(
                val_path, self.preprocessor, train.languages, self.cfg.val_limit, self.cfg.threads
            )
        return train, val

    def _initial_weights(self, path: Path) -> CCRkModel:
        try:
            start = CCRkModel.from_pretrained(path, map_location=self.device)
        except CheckpointError as exc:
            raise TrainingError(f"cannot start from {path}: {exc}") from exc
        if start.config.to_dict() != self.model_config.to_dict():
            raise TrainingError(f"{path} holds a {start.config.name!r} model, not the configured one")
        return start

    def _tokenizer(self, train: CaptionedImages) -> PreTrainedTokenizerBase:
        saved = self.cfg.output_dir / "tokenizer"
        if saved.is_dir():
            return load_tokenizer(saved)  # a resumed run must keep the vocabulary it started with
        source = self.cfg.tokenizer_dir or self.cfg.init_from
        if source is not None:
            tokenizer = load_tokenizer(source)
        else:
            tokenizer = train_tokenizer(
                iter_caption_corpus(train),
                self.model_config.text.vocab_size,
                self.model_config.text.max_length,
            )
        if len(tokenizer) > self.model_config.text.vocab_size:
            raise TrainingError(
                f"tokenizer has {len(tokenizer)} tokens but the model's vocab_size is "
                f"{self.model_config.text.vocab_size}"
            )
        tokenizer.save_pretrained(str(saved))
        return tokenizer

    def _progress(self, total: int, done: int, epoch: int) -> Any:
        from tqdm.auto import tqdm

        return tqdm(
            total=total,
            initial=done,
            desc=f"epoch {epoch + 1}/{self.cfg.epochs}",
            disable=not self.show_progress,
            unit="batch",
            dynamic_ncols=True,
        )
