"""Training a language acquisition encoder (``model.acquisition``) in MLA's two stages, the base model frozen:

1. **NLT** (Native Language Transfer): parallel sentences (native, new). The frozen model embeds the native
   sentence (any language it already has, e.g. English) once; the acquirer learns to embed the translation
   to the same point: squared error between the two L2-normalised embeddings (``2 - 2 cos``), plus, with
   ``state_weight``, the mean squared error between the pooled states before ``text_proj``. NLT alone makes
   a working acquirer.
2. **LE** (Language Exposure), when captioned images of the new language are given: image-text InfoNCE at
   the model's own (frozen) temperature against frozen image embeddings computed once, so no image tower
   runs per step.

AdamW over the new parameters only, linear warm-up then cosine decay per stage, gradients clipped at 5; every
batch is drawn from ``random.Random(f"{seed}:{stage}:{step}")`` and nothing uses dropout, so a run is
deterministic on the CPU for a given thread count.

``objective`` picks what the two stages optimise (``OBJECTIVES``): ``mla`` is the above; ``cl2cm`` replaces
NLT by CL2CM's cross-lingual stage (instance InfoNCE + self-supervised word alignment between the frozen
tower on the native side and the acquirer on the new side) and adds to LE the relational distillation from a
frozen snapshot of that CL network (``model.cl2cm``); ``mla+cl2cm`` trains the first stage with NLT's loss
and the CL losses summed, then LE with the distillation.

``model.language_baseline`` trains the whole text tower instead, with the same stages (``train_stages``), for
comparison. Over 400 lines because the objectives share this module's stage runner, data classes and report;
the CL2CM losses themselves live in ``model.cl2cm`` and ``model.cl2cm_training``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedTokenizerBase

from model.acquisition import (
    LanguageAcquirer,
    freeze,
    init_embeddings_from_base,
    train_language_tokenizer,
)
from model.acquisition_format import AcquirerConfig
from model.cl2cm_training import TextSides, cl_step_loss, le_kd_step_loss
from model.modeling import CCRkModel, pool_text_states
from model.objectives import info_nce
from model.tokenization import tokenize
from model.training_data import CaptionedImages
from model.training_step import lr_schedule, param_groups

Log = Callable[[str], None]
_ENCODE_BATCH = 256
OBJECTIVES: tuple[str, ...] = ("mla", "cl2cm", "mla+cl2cm")


@dataclass
class LanguageTrainConfig:
    """Options of one ``add-language`` run.

    Attributes:
        steps_nlt, steps_le: optimizer steps of each stage (LE runs only with captioned images); with a CL2CM
            objective ``steps_nlt`` counts the CL stage's steps.
        batch_size: sentence pairs (NLT) or images (LE) per step.
        learning_rate: peak LR of the acquirer; baseline_learning_rate: of ``full_finetune_baseline``.
        bottleneck: adapter width (clamped to the hidden size).
        vocab_size: upper bound of the language's BPE vocabulary (a small corpus stops it earlier).
        state_weight: NLT weight of the pooled pre-projection state term (0: embeddings only, as the paper;
            on the demo model 1.0 helps a little early, ko R@1 0.827 against 0.808 after 50 NLT steps, and
            not at all by 150).
        embedding_init: ``base-pieces`` or ``random`` (see ``model.acquisition``).
        threads: CPU threads for torch (None: leave the process setting alone).
        objective: ``mla``, ``cl2cm`` or ``mla+cl2cm`` (see the module docstring).
        word_weight: CL2CM's word-alignment loss weight in the CL stage.
        kd_weight: CL2CM's relational distillation weight in LE. 0.1: chosen on a validation split (it,
            40 % noise, seed 0; IR/TR R@1 81.0/86.0 at 0, 81.0/86.5 at 0.03, 80.2/88.0 at 0.1); at 0.3 and
            1.0 it costs 10-30 IR R@1 points (the word-level relation is flat on captions that differ in
            one attribute word, and the distillation pulls those hard negatives together).
    """

    steps_nlt: int = 600
    steps_le: int = 300
    batch_size: int = 64
    learning_rate: float = 2e-3
    baseline_learning_rate: float = 1e-4
    weight_decay: float = 0.01
    warmup_steps: int = 50
    seed: int = 0
    bottleneck: int = 64
    vocab_size: int = 4000
    state_weight: float = 0.0
    embedding_init: str = "random"
    threads: int | None = None
    objective: str = "mla"
    word_weight: float = 1.0
    kd_weight: float = 0.1

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; one of {', '.join(OBJECTIVES)}")
        if self.word_weight < 0 or self.kd_weight < 0:
            raise ValueError("word_weight and kd_weight must be >= 0")
        if self.steps_nlt < 0 or self.steps_le < 0 or self.steps_nlt + self.steps_le == 0:
            raise ValueError("steps_nlt and steps_le must be >= 0, and not both 0")
        if self.batch_size < 2:
            raise ValueError("batch_size must be >= 2 (LE contrasts images within a batch)")


@dataclass
class LanguageData:
    """What a language is learned from.

    Attributes:
        lang: the new language; native: the language(s) of the pairs' source side.
        pairs: (native sentence, its translation) for NLT.
        captions: images with captions in ``lang`` (``languages == (lang,)``) for LE, or None.
        native_captions: per LE image, its captions in ``native[0]``, slot for slot (CL2CM's teacher reads
            them), or None.
        image_embeds: the frozen model's embeddings of ``captions``' images when already computed (an
            experiment trains many acquirers on the same images), or None.
        sources: where the data came from (file paths), for the report.
    """

    lang: str
    native: tuple[str, ...]
    pairs: list[tuple[str, str]]
    captions: CaptionedImages | None = None
    sources: dict[str, str] = field(default_factory=dict)
    native_captions: list[list[str]] | None = None
    image_embeds: torch.Tensor | None = None

    def new_texts(self) -> list[str]:
        texts = [new for _, new in self.pairs]
        if self.captions is not None:
            texts += [t for caps in self.captions.captions for t in caps[self.lang]]
        return texts


@dataclass
class AcquisitionResult:
    acquirer: LanguageAcquirer
    tokenizer: PreTrainedTokenizerBase
    report: dict[str, Any]


class Student:
    """What a stage trains: a text encoder over its tokenizer, and the module that owns its parameters."""

    def __init__(
        self,
        module: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int,
        encode: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        self.module, self.tokenizer, self.max_length, self.encode = module, tokenizer, max_length, encode

    def texts(self, texts: Sequence[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(pooled (B, H), embeds (B, D)) of ``texts``."""
        batch = tokenize(self.tokenizer, list(texts), self.max_length)
        return self.encode(batch["input_ids"].to(device), batch["attention_mask"].to(device))


def base_text_encoder(
    model: CCRkModel,
) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    def encode(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = model.text_encoder.forward_text(ids, mask)
        pooled = pool_text_states(hidden, mask, model.config.text.pooling)
        return pooled, F.normalize(model.text_proj(pooled), dim=-1)

    return encode


@torch.no_grad()
def teacher_targets(
    base: CCRkModel, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen model's (pooled, embeds) of the native sentences, computed once."""
    teacher = Student(base, tokenizer, base.config.text.max_length, base_text_encoder(base))
    device = base.text_proj.weight.device
    parts = [teacher.texts(texts[i : i + _ENCODE_BATCH], device) for i in range(0, len(texts), _ENCODE_BATCH)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


@torch.no_grad()
def image_embeds(base: CCRkModel, data: CaptionedImages) -> torch.Tensor:
    """Frozen image embeddings of the LE images, computed once."""
    from model.preprocessing import ImagePreprocessor

    pre = ImagePreprocessor(base.config.vision)
    device = base.text_proj.weight.device
    parts = [
        base.encode_image(pre.normalize(data.pixels[i : i + 64]).to(device)).image_embeds
        for i in range(0, len(data), 64)
    ]
    return torch.cat(parts)


def _nlt_loss(
    student: Student,
    pairs: list[tuple[str, str]],
    targets: tuple[torch.Tensor, torch.Tensor],
    batch_size: int,
    state_weight: float,
) -> Callable[[random.Random], torch.Tensor]:
    pooled_t, embeds_t = targets

    def loss(rng: random.Random) -> torch.Tensor:
        index = rng.sample(range(len(pairs)), min(batch_size, len(pairs)))
        pooled, embeds = student.texts([pairs[i][1] for i in index], embeds_t.device)
        value = (embeds - embeds_t[index]).pow(2).sum(dim=-1).mean()
        if state_weight > 0:
            value = value + state_weight * F.mse_loss(pooled, pooled_t[index])
        return value

    return loss


def _le_loss(
    student: Student, data: CaptionedImages, images: torch.Tensor, batch_size: int, temperature: float
) -> Callable[[random.Random], torch.Tensor]:
    lang = data.languages[0]

    def loss(rng: random.Random) -> torch.Tensor:
        order = rng.sample(range(len(data)), len(data))
        index, keys = [], set()
        for i in order:  # one image per product: a duplicate would be a false negative
            if data.item_keys[i] not in keys:
                keys.add(data.item_keys[i])
                index.append(i)
                if len(index) == batch_size:
                    break
        texts = [rng.choice(data.captions[i][lang]) for i in index]
        _, embeds = student.texts(texts, images.device)
        return info_nce(images[index], embeds, temperature).loss

    return loss


def _run_stage(
    name: str,
    steps: int,
    module: nn.Module,
    loss_fn: Callable[[random.Random], torch.Tensor],
    lr: float,
    cfg: LanguageTrainConfig,
    log: Log,
) -> dict[str, Any]:
    optimizer = torch.optim.AdamW(param_groups(module, cfg.weight_decay), lr=lr)  # type: ignore[arg-type]
    warmup = min(cfg.warmup_steps, max(1, steps // 5))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(warmup, steps))
    params = [p for group in optimizer.param_groups for p in group["params"]]
    losses: list[float] = []
    start = time.perf_counter()
    for step in range(steps):
        loss = loss_fn(random.Random(f"{cfg.seed}:{name}:{step}"))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 5.0)
        optimizer.step()
        scheduler.step()
        losses.append(round(float(loss.detach()), 6))
        if (step + 1) % max(1, steps // 5) == 0 or step + 1 == steps:
            log(f"{name} step {step + 1}/{steps}: loss {losses[-1]:.4f}")
    return {"steps": steps, "losses": losses, "seconds": round(time.perf_counter() - start, 3)}


def train_stages(
    student: Student,
    base: CCRkModel,
    base_tokenizer: PreTrainedTokenizerBase,
    data: LanguageData,
    cfg: LanguageTrainConfig,
    lr: float,
    log: Log,
) -> dict[str, Any]:
    """NLT (when pairs and steps), then LE (when captions and steps); the report of each stage."""
    stages: dict[str, Any] = {}
    if cfg.steps_nlt and data.pairs:
        targets = teacher_targets(base, base_tokenizer, [src for src, _ in data.pairs])
        loss = _nlt_loss(student, data.pairs, targets, cfg.batch_size, cfg.state_weight)
        stages["nlt"] = _run_stage("nlt", cfg.steps_nlt, student.module, loss, lr, cfg, log)
    if cfg.steps_le and data.captions is not None:
        images = data.image_embeds if data.image_embeds is not None else image_embeds(base, data.captions)
        temperature = float(base.temperature.detach())
        loss = _le_loss(student, data.captions, images, cfg.batch_size, temperature)
        stages["le"] = _run_stage("le", cfg.steps_le, student.module, loss, lr, cfg, log)
    if not stages:
        raise ValueError("nothing to train: NLT needs parallel pairs, LE captioned images (and steps > 0)")
    return stages


def cl2cm_stages(
    acquirer: LanguageAcquirer,
    tokenizer: PreTrainedTokenizerBase,
    base: CCRkModel,
    base_tokenizer: PreTrainedTokenizerBase,
    data: LanguageData,
    cfg: LanguageTrainConfig,
    log: Log,
) -> dict[str, Any]:
    """CL2CM's stages (``cfg.objective`` ``cl2cm`` or ``mla+cl2cm``): the CL stage on the pairs (``cl``),
    then LE with the relational distillation of a frozen snapshot of the CL network (``le``)."""
    stages: dict[str, Any] = {}
    temperature = float(base.temperature.detach())
    sides = TextSides(base, base_tokenizer, tokenizer, acquirer.config.max_length)
    if cfg.steps_nlt and data.pairs:
        targets = None
        if cfg.objective == "mla+cl2cm":
            targets = teacher_targets(base, base_tokenizer, [src for src, _ in data.pairs])[1]
        loss = cl_step_loss(
            sides, acquirer, data.pairs, cfg.batch_size, temperature, cfg.word_weight, targets
        )
        stages["cl"] = _run_stage(
            "cl",
            cfg.steps_nlt,
            acquirer,
            loss,
            cfg.learning_rate,
            cfg,
            log,
        )
    if cfg.steps_le and data.captions is not None:
        if cfg.kd_weight > 0 and data.native_captions is None:
            raise ValueError(
                f"CL2CM's distillation needs the LE images' captions in {data.native[0]!r} too "
                "(the catalogue's records lack them)"
            )
        teacher = LanguageAcquirer(acquirer.config, base).to(base.text_proj.weight.device)
        teacher.load_state_dict(acquirer.state_dict())
        teacher.eval().requires_grad_(False)
        images = data.image_embeds if data.image_embeds is not None else image_embeds(base, data.captions)
        loss = le_kd_step_loss(
            sides,
            acquirer,
            teacher,
            data.lang,
            data.captions.captions,
            data.native_captions or [[] for _ in range(len(data.captions))],
            data.captions.item_keys,
            images,
            cfg.batch_size,
            temperature,
            cfg.kd_weight,
        )
        stages["le"] = _run_stage("le", cfg.steps_le, acquirer, loss, cfg.learning_rate, cfg, log)
    if not stages:
        raise ValueError(
            "nothing to train: the CL stage needs parallel pairs, LE captioned images (and steps > 0)"
        )
    return stages


def tokens_per_text(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> float:
    """Mean tokens per text, ``<s>``/``</s>`` included, without truncation."""
    if not texts:
        return 0.0
    lengths = [len(ids) for ids in tokenizer(list(texts), verbose=False)["input_ids"]]
    return sum(lengths) / len(lengths)


def _tokenizer_report(
    base_tokenizer: PreTrainedTokenizerBase,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    limit: int,
) -> dict[str, Any]:
    sample = list(texts[:2000])
    shared = [len(ids) for ids in base_tokenizer(sample, verbose=False)["input_ids"]]
    return {
        "vocab_size": len(tokenizer),
        "tokens_per_text_shared": round(sum(shared) / max(1, len(shared)), 2),
        "tokens_per_text_own": round(tokens_per_text(tokenizer, sample), 2),
        "shared_over_max_length": round(sum(n > limit for n in shared) / max(1, len(shared)), 4),
        "texts_measured": len(sample),
    }


_METHODS = {
    "mla": "MLA: frozen base, language acquisition encoder (NLT then LE)",
    "cl2cm": "CL2CM over MLA's acquirer: CL stage (instance + word alignment), then LE + relational KD",
    "mla+cl2cm": "MLA + CL2CM: NLT and CL losses together, then LE + relational KD",
}


def train_acquirer(
    base: CCRkModel,
    base_tokenizer: PreTrainedTokenizerBase,
    data: LanguageData,
    cfg: LanguageTrainConfig,
    base_fingerprint: str,
    log: Log = print,
) -> AcquisitionResult:
    """Train ``data.lang``'s acquisition encoder over ``base`` (frozen here, and left unchanged)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    base = freeze(base)
    text = base.config.text
    texts = data.new_texts()
    tokenizer = train_language_tokenizer(texts, cfg.vocab_size, text.max_length)
    if tokenizer.pad_token_id != text.pad_token_id:
        raise ValueError(
            f"the new tokenizer pads with {tokenizer.pad_token_id}, the base with {text.pad_token_id}"
        )
    config = AcquirerConfig(
        lang=data.lang,
        native=data.native,
        base_model=base.config.name,
        base_fingerprint=base_fingerprint,
        hidden_size=text.hidden_size,
        num_text_layers=text.num_text_layers,
        pooling=text.pooling,
        vocab_size=len(tokenizer),
        max_length=text.max_length,
        bottleneck=min(cfg.bottleneck, text.hidden_size),
        embedding_init=cfg.embedding_init,
        steps_nlt=cfg.steps_nlt if data.pairs else 0,
        steps_le=cfg.steps_le if data.captions is not None else 0,
        seed=cfg.seed,
    )
    torch.manual_seed(cfg.seed)
    device = base.text_proj.weight.device
    acquirer = LanguageAcquirer(config, base).to(device)
    initialised = (
        init_embeddings_from_base(acquirer, tokenizer, base_tokenizer)
        if cfg.embedding_init == "base-pieces"
        else 0
    )
    acquirer.train()

    def encode(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, pooled, embeds = acquirer(ids, mask)
        return pooled, embeds

    if cfg.objective == "mla":
        student = Student(acquirer, tokenizer, config.max_length, encode)
        stages = train_stages(student, base, base_tokenizer, data, cfg, cfg.learning_rate, log)
    else:
        stages = cl2cm_stages(acquirer, tokenizer, base, base_tokenizer, data, cfg, log)
    acquirer.eval()
    report = {
        "lang": data.lang,
        "native": list(data.native),
        "method": _METHODS[cfg.objective],
        "objective": cfg.objective,
        **stages,
        "minutes": round((time.perf_counter() - start) / 60, 3),
        "parameters_added": acquirer.parameter_count(),
        "parameters_base": sum(p.numel() for p in base.parameters()),
        "embeddings_initialised_from_base": initialised,
        "tokenizer": _tokenizer_report(base_tokenizer, tokenizer, texts, text.max_length),
        "data": {
            "pairs": len(data.pairs),
            "images": len(data.captions) if data.captions else 0,
            **data.sources,
        },
        "train_config": asdict(cfg),
    }
    return AcquisitionResult(acquirer, tokenizer, report)
