"""Training CCRk: 1-to-K (or 1-to-1) contrastive learning plus MITM with hard samples and CMLM, optionally
MURAL's translation-pair term; checkpoints every epoch (and every N steps) and resumes after interruption.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from model.configs import CCRkConfig
from model.evaluation import evaluate
from model.modeling import CCRkModel, CheckpointError
from model.objectives import (
    IGNORE_INDEX,
    info_nce,
    itm_labels,
    kcl_loss,
    mask_tokens,
    sample_hard_negatives,
    sample_hard_positives,
    sample_one_language,
    translation_pair_loss,
)
from model.parallel_corpus import ParallelCorpus, ParallelCorpusError
from model.preprocessing import ImagePreprocessor
from model.tokenization import load_tokenizer, train_tokenizer
from model.training_data import (
    CaptionedImages,
    TrainBatch,
    epoch_batches,
    iter_caption_corpus,
    load_captioned_images,
    make_batch,
)

Objective = Literal["kcl", "one2one"]
STATE_FILE = "trainer_state.pt"


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
class StepLosses:
    total: torch.Tensor
    contrastive: torch.Tensor
    itm: torch.Tensor
    mlm: torch.Tensor
    translation: torch.Tensor

    def as_floats(self) -> dict[str, float]:
        return {k: float(v.detach()) for k, v in vars(self).items()}


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


def training_step(
    model: CCRkModel,
    batch: TrainBatch,
    objective: Objective,
    cfg: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    generator: torch.Generator,
    parallel: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None,
) -> StepLosses:
    """Losses of one batch; see ``model.objectives`` for each term."""
    device = batch.pixel_values.device
    # torch.Generator lives on the CPU; on CUDA sampling draws from the device's default generator.
    device_generator = generator if device.type == "cpu" else None
    temp = model.temperature
    image = model.encode_image(batch.pixel_values)
    b, k = batch.text_mask.shape
    if objective == "kcl":
        text = model.encode_text(batch.input_ids, batch.attention_mask)
        text_embeds = text.text_embeds.view(b, k, -1)
        contrastive = kcl_loss(image.image_embeds, text_embeds, temp, batch.text_mask).loss
        langs = sample_hard_positives(
            image.image_embeds, text_embeds, temp, batch.text_mask, device_generator
        )
        rows = torch.arange(b, device=device) * k + langs.to(device)
        pos_ids, pos_mask = batch.input_ids[rows], batch.attention_mask[rows]
        pos_states, pos_embeds = text.last_hidden_state[rows], text.text_embeds[rows]
    else:
        # 1-to-1: only the sampled caption of each image is encoded, as prior methods train.
        langs = sample_one_language(batch.text_mask.cpu(), generator).to(device)
        rows = torch.arange(b, device=device) * k + langs
        pos_ids, pos_mask = batch.input_ids[rows], batch.attention_mask[rows]
        text = model.encode_text(pos_ids, pos_mask)
        pos_states, pos_embeds = text.last_hidden_state, text.text_embeds
        contrastive = info_nce(image.image_embeds, pos_embeds, temp).loss

    zero = torch.zeros((), device=device)
    itm = zero
    if cfg.itm_weight > 0:
        neg_texts, neg_images = sample_hard_negatives(
            image.image_embeds, pos_embeds, temp, batch.same_item, device_generator
        )
        fused = model.fuse(
            torch.cat([pos_states, pos_states, pos_states[neg_texts]]),
            torch.cat([pos_mask, pos_mask, pos_mask[neg_texts]]),
            torch.cat([image.image_tokens, image.image_tokens[neg_images], image.image_tokens]),
        )
        itm = F.cross_entropy(fused.itm_logits.float(), itm_labels(b, device))
    mlm = zero
    if cfg.mlm_weight > 0:
        masked, labels = mask_tokens(
            pos_ids.cpu(),
            pos_mask.cpu(),
            tokenizer.mask_token_id,
            model.config.text.vocab_size,
            tokenizer.all_special_ids,
            cfg.mlm_probability,
            generator,
        )
        masked, labels = masked.to(device), labels.to(device)
        states = model.encode_text(masked, pos_mask).last_hidden_state
        fused_states = model.fuse(states, pos_mask, image.image_tokens).last_hidden_state
        picked = labels != IGNORE_INDEX
        mlm = F.cross_entropy(model.mlm_logits(fused_states[picked]).float(), labels[picked])
    translation = zero
    if parallel is not None and cfg.translation_weight > 0:
        src, tgt = parallel
        src_embeds = model.encode_text(src["input_ids"], src["attention_mask"]).text_embeds
        tgt_embeds = model.encode_text(tgt["input_ids"], tgt["attention_mask"]).text_embeds
        translation = translation_pair_loss(src_embeds, tgt_embeds, temp)
    total = contrastive + cfg.itm_weight * itm + cfg.mlm_weight * mlm + cfg.translation_weight * translation
    return StepLosses(total, contrastive, itm, mlm, translation)


def _param_groups(model: CCRkModel, weight_decay: float) -> list[dict[str, Any]]:
    decay, no_decay = [], []
    seen: set[int] = set()
    for name, param in model.named_parameters():
        if id(param) in seen or not param.requires_grad:
            continue
        seen.add(id(param))
        # Norms, biases and the temperature are not decayed (standard for transformers and CLIP).
        (no_decay if param.ndim < 2 or name == "temp" else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))

    return schedule


def _latest_checkpoint(output_dir: Path) -> Path | None:
    ckpts = sorted(
        (p for p in (output_dir / "checkpoints").glob("step-*") if (p / STATE_FILE).is_file()),
        key=lambda p: int(p.name.split("-")[1]),
    )
    return ckpts[-1] if ckpts else None


class Trainer:
    """Runs one training configuration; ``run()`` resumes from the newest complete checkpoint."""

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

    def _save_checkpoint(
        self, model: CCRkModel, tokenizer: PreTrainedTokenizerBase, state: dict[str, Any], step: int
    ) -> None:
        ckpt_root = self.cfg.output_dir / "checkpoints"
        final = ckpt_root / f"step-{step}"
        tmp = ckpt_root / f".tmp-step-{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, tokenizer)
        torch.save(state, tmp / STATE_FILE)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)  # a checkpoint directory exists only once complete
        ckpts = sorted((p for p in ckpt_root.glob("step-*")), key=lambda p: int(p.name.split("-")[1]))
        for old in ckpts[: -self.cfg.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    def run(self) -> TrainResult:
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

        torch.manual_seed(cfg.seed)
        model = CCRkModel(self.model_config).to(self.device)
        optimizer = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.learning_rate)
        steps_per_epoch = len(epoch_batches(len(train), cfg.batch_size, cfg.seed, 0))
        total_steps = steps_per_epoch * cfg.epochs
        if cfg.max_steps is not None:
            total_steps = min(total_steps, cfg.max_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg.warmup_steps, total_steps))
        use_amp = cfg.amp and self.device.type == "cuda"
        amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16
        scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)

        step, history = 0, []
        latest = _latest_checkpoint(cfg.output_dir)
        if latest is None and initial is not None:
            model.load_state_dict(initial.state_dict())
            self.log(f"starting from the weights of {cfg.init_from}")
        del initial
        if latest is not None:
            state = torch.load(latest / STATE_FILE, map_location="cpu", weights_only=True)
            if state.get("model_config") != self.model_config.to_dict():
                raise TrainingError(
                    f"checkpoint {latest} was trained with another model config; use a new output dir"
                )
            loaded = CCRkModel.from_pretrained(latest, map_location=self.device)
            model.load_state_dict(loaded.state_dict())
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            scaler.load_state_dict(state["scaler"])
            step, history = int(state["step"]), list(state["history"])
            self.log(f"resumed from {latest} at step {step}")

        start_time = time.perf_counter()
        samples_seen = 0
        epoch = step // steps_per_epoch
        while epoch < cfg.epochs and step < total_steps:
            batches = epoch_batches(len(train), cfg.batch_size, cfg.seed, epoch)
            skip = step - epoch * steps_per_epoch
            progress = self._progress(len(batches), skip, epoch)
            model.train()
            epoch_losses: dict[str, float] = {}
            for index in batches[skip:]:
                if step >= total_steps:
                    break
                # Per-step seeds make sampling independent of where a resumed run restarted.
                rng = random.Random(f"{cfg.seed}:{step}")
                generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
                torch.manual_seed(cfg.seed * 1_000_003 + step)  # dropout masks, also on CUDA
                batch = make_batch(
                    train, index, tokenizer, self.preprocessor, self.model_config.text.max_length, rng
                )
                batch = batch.to(self.device)
                pairs = None
                if parallel is not None and cfg.translation_weight > 0:
                    pairs = parallel.batch(tokenizer, cfg.batch_size, self.model_config.text.max_length, rng)
                    pairs = tuple({k: v.to(self.device) for k, v in p.items()} for p in pairs)
                autocast = torch.autocast("cuda", dtype=amp_dtype) if use_amp else nullcontext()
                with autocast:
                    losses = training_step(model, batch, cfg.objective, cfg, tokenizer, generator, pairs)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(losses.total).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                step += 1
                samples_seen += len(index)
                floats = losses.as_floats()
                for key, value in floats.items():
                    epoch_losses[key] = epoch_losses.get(key, 0.0) + value
                elapsed = time.perf_counter() - start_time
                progress.update(1)
                progress.set_postfix(
                    loss=f"{floats['total']:.3f}", sps=f"{samples_seen / max(elapsed, 1e-9):.1f}"
                )
                if cfg.save_every_steps and step % cfg.save_every_steps == 0 and step % steps_per_epoch:
                    self._save_checkpoint(
                        model, tokenizer, self._state(optimizer, scheduler, scaler, step, history), step
                    )
            progress.close()
            done_in_epoch = step - epoch * steps_per_epoch - skip
            record: dict[str, Any] = {
                "epoch": epoch + 1,
                "step": step,
                "loss": {k: v / max(1, done_in_epoch) for k, v in epoch_losses.items()},
                "seconds": time.perf_counter() - start_time,
            }
            if val is not None:
                result = evaluate(model, tokenizer, val, self.preprocessor, device=self.device)
                scores = result.report()["dual"]
                record["val_ir_mean_recall"] = scores["IR"]["mean_recall"]
                record["val_ir_mrv"] = scores["IR"]["mrv"]
                self.log(
                    f"epoch {epoch + 1}: loss {record['loss'].get('total', float('nan')):.4f}  "
                    f"val IR mean recall {record['val_ir_mean_recall'] * 100:.2f}  "
                    f"MRV {record['val_ir_mrv']:.2f}"
                )
            history.append(record)
            self._save_checkpoint(
                model, tokenizer, self._state(optimizer, scheduler, scaler, step, history), step
            )
            epoch += 1

        elapsed = time.perf_counter() - start_time
        model_dir = cfg.output_dir / "model"
        tmp = cfg.output_dir / ".tmp-model"
        shutil.rmtree(tmp, ignore_errors=True)
        model.eval()
        model.cpu().save_pretrained(tmp, tokenizer)
        (tmp / "training.json").write_text(
            json.dumps({"train_config": cfg.to_json(), "history": history}, indent=2) + "\n", encoding="utf-8"
        )
        shutil.rmtree(model_dir, ignore_errors=True)
        tmp.rename(model_dir)
        return TrainResult(model_dir, step, epoch, elapsed, samples_seen / max(elapsed, 1e-9), history)

    def _state(self, optimizer: Any, scheduler: Any, scaler: Any, step: int, history: list) -> dict[str, Any]:
        return {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "step": step,
            "history": history,
            "model_config": self.model_config.to_dict(),
            "train_config": self.cfg.to_json(),
        }

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
