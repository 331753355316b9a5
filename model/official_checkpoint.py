"""Load the official CCRk checkpoints (``ccrk_2m_10lan_epoch_29.th``, ``ccrk_3m_10lan_epoch_29.th``) into
:class:`CCRkModel` by key mapping, and write a model back in the official layout.

The official code builds on CCLM/X-VLM: a Microsoft-Swin image encoder (patch merging at the *end* of a
stage), a BERT-class text stack (``text_encoder.bert.*``, MLM head ``text_encoder.cls.predictions.*``) holding
XLM-R weights, and momentum/queue/bbox extras that this model does not have.

Three differences beyond names:

* timm's Swin merges patches at the *start* of the next stage; timm's own ``checkpoint_filter_fn`` does
  the tensor work (patch-embed resizing), the stage shift is mirrored here to track keys.
* Swin relative-position bias tables of another window size (the 224 px, window-7 release loaded into the
  384 px, window-12 fine-tuning shape) are resized as the official code does, bicubically on BEiT's
  geometric grid (:func:`resize_relative_position_bias`), not with timm's linear resize of the same grid.
* The official text stack is BERT code, whose position ids run ``0..L-1``; transformers' XLM-R embeddings
  start at ``pad_token_id + 1``. The position table is therefore rolled by ``pad_token_id + 1`` rows on load
  (and back on export) so that every real token reads the row it was trained with (``bert_positions``).

Over 400 lines because the key map has to be read as one table in both directions (load and export share
it); the numeric parts (Swin resize, position roll) live in their own functions or ``model.swin_resize``.
"""

from __future__ import annotations

import logging
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from timm.models.swin_transformer import SwinTransformer, checkpoint_filter_fn

from model.configs import CCRkConfig
from model.modeling import CCRkModel, CheckpointError
from model.swin_resize import REL_POS_TABLE, resize_relative_position_bias, square_window, table_window

logger = logging.getLogger(__name__)

Shape = tuple[int, ...]

POSITION_KEY = "text_encoder.embeddings.position_embeddings.weight"
_TEXT_STACK = re.compile(r"^text_encoder\.(?:bert\.|roberta\.)?(embeddings|encoder)\.(.+)$")
# Keys of the official training model that this inference model deliberately lacks.
_IGNORED = tuple(
    re.compile(p)
    for p in (
        r"^[^.]+_m(\.|$)",  # momentum encoders / projections (ALBEF-style distillation)
        r"^[^.]*queue[^.]*$",  # image/text/idx queues and their pointers
        r"^bbox_head\.",  # X-VLM box regression head, pre-training only
        r"^text_encoder\.(?:bert\.|roberta\.)?pooler\.",
        r"^text_encoder\.(?:bert\.|roberta\.)?embeddings\.(position_ids|token_type_ids)$",
        r"^vision_encoder\.(?:backbone\.)?(head|avgpool)(\.|$)",  # ImageNet classifier of the Swin code
        r"^vision_encoder\.(?:backbone\.)?.*(relative_position_index|attn_mask)$",  # recomputed buffers
    )
)
_MS_DOWNSAMPLE = re.compile(r"^layers\.(\d+)\.downsample\.")


def _mlm_head_keys() -> dict[str, tuple[tuple[str, ...], int]]:
    """Official MLM head key -> (model keys, rank); a lower rank wins when two keys feed the same tensor."""
    both_biases = ("mlm_head.bias", "mlm_head.decoder.bias")
    cls = {
        "cls.predictions.transform.dense.weight": (("mlm_head.dense.weight",), 0),
        "cls.predictions.transform.dense.bias": (("mlm_head.dense.bias",), 0),
        "cls.predictions.transform.LayerNorm.weight": (("mlm_head.layer_norm.weight",), 0),
        "cls.predictions.transform.LayerNorm.bias": (("mlm_head.layer_norm.bias",), 0),
        # Tied to the word embeddings, which take precedence (rank 1).
        "cls.predictions.decoder.weight": (("mlm_head.decoder.weight",), 1),
        "cls.predictions.bias": (both_biases, 0),
        "cls.predictions.decoder.bias": (both_biases, 1),
    }
    lm_head = {
        "lm_head.dense.weight": (("mlm_head.dense.weight",), 0),
        "lm_head.dense.bias": (("mlm_head.dense.bias",), 0),
        "lm_head.layer_norm.weight": (("mlm_head.layer_norm.weight",), 0),
        "lm_head.layer_norm.bias": (("mlm_head.layer_norm.bias",), 0),
        "lm_head.decoder.weight": (("mlm_head.decoder.weight",), 1),
        "lm_head.bias": (both_biases, 0),
        "lm_head.decoder.bias": (both_biases, 1),
    }
    return {f"text_encoder.{k}": v for k, v in (cls | lm_head).items()}


_MLM_HEAD = _mlm_head_keys()


@dataclass
class LoadReport:
    """What happened to each key when an official checkpoint was mapped onto a model.

    Attributes:
        loaded: model keys that received a tensor (tied aliases included).
        missing: model keys the checkpoint has no tensor for; they keep their random initialisation.
        unexpected: checkpoint keys that fit nothing in the model and are not known extras.
        ignored: checkpoint keys known to belong to the training model only (momentum encoders, queues,
            bbox head, pooler, Swin buffers, classifier head).
        shape_mismatch: ``(model key, checkpoint shape, model shape)`` for tensors that were not loaded.
        notes: decisions worth knowing (tied tensors that disagreed, position table roll, ...).
    """

    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    shape_mismatch: list[tuple[str, Shape, Shape]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every model tensor was loaded and no checkpoint tensor was left unexplained."""
        return not (self.missing or self.unexpected or self.shape_mismatch)

    def summary(self, limit: int = 5) -> str:
        lines = [
            f"loaded {len(self.loaded)}, missing {len(self.missing)}, unexpected {len(self.unexpected)}, "
            f"ignored {len(self.ignored)}, shape mismatches {len(self.shape_mismatch)}"
        ]
        for name, keys in (
            ("missing", self.missing),
            ("unexpected", self.unexpected),
            ("ignored", self.ignored),
        ):
            if keys:
                lines.append(f"  {name}: {_first(keys, limit)}")
        if self.shape_mismatch:
            shown = [
                f"{key} (checkpoint {tuple(ckpt)} vs model {tuple(want)})"
                for key, ckpt, want in self.shape_mismatch
            ]
            lines.append(f"  shape mismatch: {_first(shown, limit)}")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


def _first(items: list[str], limit: int) -> str:
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


@dataclass
class _Candidate:
    source: str
    target: str
    tensor: torch.Tensor
    rank: int = 0


def _is_ignored(key: str) -> bool:
    return any(p.search(key) for p in _IGNORED)


def _position_offset(model: CCRkModel) -> int:
    return int(model.config.text.pad_token_id) + 1


def _map_vision(items: dict[str, torch.Tensor], model: CCRkModel, report: LoadReport) -> list[_Candidate]:
    """``vision_encoder.*`` keys (official or already in ``vision_encoder.backbone.*`` form) -> candidates."""
    backbone = model.vision_encoder.backbone
    wanted = backbone.state_dict()
    local = {re.sub(r"^vision_encoder\.(backbone\.)?", "", k): k for k in items}
    is_swin = isinstance(backbone, SwinTransformer)
    # Same test as timm: only the Microsoft layout has a patch merging in stage 0.
    ms_layout = is_swin and "layers.0.downsample.reduction.weight" in local
    out: list[_Candidate] = []
    resized: list[str] = []
    cubic: list[str] = []
    for key, source in local.items():
        tensor = items[source]
        if ms_layout:
            key = _MS_DOWNSAMPLE.sub(lambda m: f"layers.{int(m.group(1)) + 1}.downsample.", key)
        if key not in wanted:
            report.unexpected.append(source)
            continue
        src_window = dst_window = None
        if is_swin and key.endswith(REL_POS_TABLE) and tensor.shape != wanted[key].shape:
            src_window, dst_window = table_window(tensor), square_window(backbone, key)
        if src_window is not None and dst_window is not None and tensor.shape[1:] == wanted[key].shape[1:]:
            # The official resize (bicubic); timm's filter would resize the same grid linearly.
            adapted = resize_relative_position_bias(tensor, src_window, dst_window)
            cubic.append(f"{source} {tuple(tensor.shape)} -> {tuple(adapted.shape)}")
            tensor = adapted
        elif is_swin:
            try:
                # Resizes patch-embed kernels (and non-square rel-pos tables) to this backbone; a lone key
                # keeps it from renaming anything (the stage shift is done above, per key).
                adapted = checkpoint_filter_fn({key: tensor}, backbone)[key]
            except (RuntimeError, ValueError) as exc:
                logger.warning("timm could not adapt %s: %s", source, exc)
            else:
                if adapted.shape != tensor.shape:
                    resized.append(f"{source} {tuple(tensor.shape)} -> {tuple(adapted.shape)}")
                tensor = adapted
        out.append(_Candidate(source, f"vision_encoder.backbone.{key}", tensor))
    if cubic:
        report.notes.append(
            f"{len(cubic)} relative-position bias table(s) resized bicubically on BEiT's grid as the "
            f"official code does (not timm's linear resize): {_first(cubic, 2)}"
        )
    if resized:
        report.notes.append(
            f"timm resized {len(resized)} vision tensor(s) to this backbone: {_first(resized, 2)}"
        )
    return out


def map_official_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    model: CCRkModel,
    bert_positions: bool | None = None,
) -> tuple[dict[str, torch.Tensor], LoadReport]:
    """Translate an official CCRk/CCLM/X2VLM state dict to ``model``'s key names.

    Args:
        state_dict: the official tensors (``checkpoint["model"]`` or a raw state dict).
        model: the target; used for names, shapes and the Swin layout.
        bert_positions: whether the checkpoint's text stack numbers positions from 0 (BERT code, as in the
            official CCRk/CCLM files) rather than from ``pad_token_id + 1`` (XLM-R code). ``None`` infers
            it: XLM-R numbering only for ``text_encoder.roberta.*`` keys.

    Returns:
        The tensors to pass to ``model.load_state_dict(..., strict=False)`` (only those that fit, tied
        aliases filled in) and a complete :class:`LoadReport`.
    """
    report = LoadReport()
    wanted = model.state_dict(keep_vars=True)
    if bert_positions is None:
        bert_positions = not any(k.startswith("text_encoder.roberta.") for k in state_dict)

    candidates: list[_Candidate] = []
    vision: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        if _is_ignored(key):
            report.ignored.append(key)
        elif key.startswith("vision_encoder."):
            vision[key] = tensor
        elif match := _TEXT_STACK.match(key):
            candidates.append(_Candidate(key, f"text_encoder.{match[1]}.{match[2]}", tensor))
        elif key in _MLM_HEAD:
            targets, rank = _MLM_HEAD[key]
            candidates.extend(_Candidate(key, t, tensor, rank) for t in targets if t in wanted)
        elif key in wanted:  # vision_proj, text_proj, temp, itm_head, vision_to_text
            candidates.append(_Candidate(key, key, tensor))
        else:
            report.unexpected.append(key)
    candidates.extend(_map_vision(vision, model, report))

    for cand in candidates:
        if cand.target == POSITION_KEY and bert_positions:
            cand.tensor = torch.roll(cand.tensor, shifts=_position_offset(model), dims=0)
            report.notes.append(
                f"position table rolled by {_position_offset(model)} rows: the checkpoint numbers "
                "positions from 0 (BERT), XLM-R embeddings from pad_token_id + 1"
            )
    known = [c for c in candidates if c.target in wanted]
    report.unexpected.extend(c.source for c in candidates if c.target not in wanted)

    mapped = _resolve(known, wanted, report)
    report.loaded = [k for k in wanted if k in mapped]
    mismatched = {key for key, _, _ in report.shape_mismatch}
    report.missing = [k for k in wanted if k not in mapped and k not in mismatched]
    return mapped, report


def _resolve(
    candidates: list[_Candidate], wanted: Mapping[str, torch.Tensor], report: LoadReport
) -> dict[str, torch.Tensor]:
    """Pick one tensor per model parameter; tied parameters (one tensor under several names) form one
    group, so e.g. the word embeddings and the MLM decoder cannot be loaded with different values."""
    groups: dict[int, list[str]] = {}
    for key, tensor in wanted.items():
        groups.setdefault(id(tensor), []).append(key)
    group_of = {key: members[0] for members in groups.values() for key in members}
    members_of = {members[0]: members for members in groups.values()}

    by_group: dict[str, list[_Candidate]] = {}
    for cand in candidates:
        by_group.setdefault(group_of[cand.target], []).append(cand)

    mapped: dict[str, torch.Tensor] = {}
    for head, cands in by_group.items():
        shape = tuple(wanted[head].shape)
        fitting = []
        for cand in sorted(cands, key=lambda c: c.rank):  # stable: file order breaks ties
            if tuple(cand.tensor.shape) == shape:
                fitting.append(cand)
            else:
                report.shape_mismatch.append((cand.target, tuple(cand.tensor.shape), shape))
        if not fitting:
            continue
        chosen = fitting[0]
        for other in fitting[1:]:
            if not torch.equal(other.tensor.to(chosen.tensor.dtype), chosen.tensor):
                report.notes.append(
                    f"{other.source} differs from {chosen.source} although both feed {head} "
                    f"(tied in this model); took {chosen.source}"
                )
        for key in members_of[head]:
            mapped[key] = chosen.tensor
    # A tied alias with a good value elsewhere is not a mismatch worth failing on.
    report.shape_mismatch = [m for m in report.shape_mismatch if m[0] not in mapped]
    return mapped


# -- reading files ---------------------------------------------------------------------------------------


def _torch_load(path: Path, allow_pickle: bool) -> Any:
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only load failed" not in str(exc).lower():
            raise CheckpointError(f"{path} is not a PyTorch checkpoint: {exc}") from exc
        if not allow_pickle:
            raise CheckpointError(
                f"{path} holds Python objects beyond tensors, so it can only be read by unpickling it, "
                "which runs code from the file; pass allow_pickle=True (`ccrk model convert-official "
                "--allow-pickle`) only if you trust its source"
            ) from exc
        logger.warning("loading %s with full unpickling (allow_pickle=True)", path)
    except Exception as exc:  # torch raises KeyError/EOFError/RuntimeError/... for arbitrary bytes
        raise CheckpointError(f"{path} is not a PyTorch checkpoint: {type(exc).__name__}: {exc}") from exc
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"cannot unpickle {path}: {type(exc).__name__}: {exc}") from exc


def _extract_state_dict(obj: Any, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(obj, Mapping):
        for wrapper in ("model", "state_dict", "module"):
            inner = obj.get(wrapper)
            if isinstance(inner, Mapping) and any(isinstance(v, torch.Tensor) for v in inner.values()):
                obj = inner
                break
        tensors = {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if tensors:
            if all(k.startswith("module.") for k in tensors):  # saved from a DistributedDataParallel
                tensors = {k[len("module.") :]: v for k, v in tensors.items()}
            return tensors
    raise CheckpointError(
        f"{path} holds no state dict (expected a dict of tensors, or one under 'model'); "
        f"found {type(obj).__name__}"
    )


def load_official_checkpoint(
    path: Path | str,
    config: CCRkConfig,
    strict: bool = False,
    allow_pickle: bool = False,
    bert_positions: bool | None = None,
) -> tuple[CCRkModel, LoadReport]:
    """Build ``CCRkModel(config)`` and fill it from an official ``.th`` checkpoint.

    Args:
        path: the ``.th`` file (a dict holding ``model``, or a raw state dict).
        config: architecture to load into: ``ccrk-paper-224`` (the released files' own shape, exact) or
            ``ccrk-paper`` (384 px, window 12: the fine-tuning shape, tables resized as the official code
            does).
        strict: raise :class:`CheckpointError` if any tensor is missing, unexpected or of the wrong shape.
        allow_pickle: permit a full (code-executing) unpickle when the safe loader refuses the file.
        bert_positions: see :func:`map_official_state_dict`.

    Returns:
        The model in eval mode and the :class:`LoadReport`.
    """
    path = Path(path)
    state_dict = _extract_state_dict(_torch_load(path, allow_pickle), path)
    model = CCRkModel(config)
    mapped, report = map_official_state_dict(state_dict, model, bert_positions=bert_positions)
    if strict and not report.ok:
        raise CheckpointError(
            f"{path} does not fit model config {config.name!r}:\n{report.summary(limit=20)}"
        )
    result = model.load_state_dict(mapped, strict=False)
    if result.unexpected_keys:  # cannot happen unless the mapping is wrong
        raise CheckpointError(f"internal mapping error, unexpected keys {result.unexpected_keys[:5]}")
    model.eval()
    logger.info("loaded official checkpoint %s\n%s", path, report.summary())
    return model, report


# -- writing the official layout -------------------------------------------------------------------------


def _swin_to_official(backbone: SwinTransformer) -> dict[str, torch.Tensor]:
    """timm Swin -> Microsoft layout: patch merging back to the end of the previous stage, buffers added."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in backbone.state_dict().items():
        key = _MS_DOWNSAMPLE.sub(lambda m: f"layers.{int(m.group(1)) - 1}.downsample.", key)
        if key.startswith("head.fc."):
            key = "head." + key[len("head.fc.") :]
        out[key] = tensor
    for name, buf in backbone.named_buffers():
        if name.endswith(("relative_position_index", "attn_mask")):
            out[name] = buf
    return out


def to_official_state_dict(
    model: CCRkModel, bert_prefix: str = "bert.", bert_positions: bool | None = None
) -> dict[str, torch.Tensor]:
    """``model``'s weights in the official CCRk layout (inverse of :func:`map_official_state_dict`).

    Swin weights use the Microsoft layout (patch merging at the end of stage i, ``relative_position_index``
    and ``attn_mask`` buffers included); the text stack is written under ``text_encoder.{bert_prefix}`` with
    the MLM head as ``text_encoder.cls.predictions.*``. ``bert_positions`` (default: unless the prefix is
    ``roberta.``) rolls the position table back to BERT numbering. Tensors share storage with the model.
    """
    if bert_positions is None:
        bert_positions = bert_prefix != "roberta."
    sd = model.state_dict()
    backbone = model.vision_encoder.backbone
    vision = _swin_to_official(backbone) if isinstance(backbone, SwinTransformer) else backbone.state_dict()
    out = {f"vision_encoder.{k}": v for k, v in vision.items()}

    head = "text_encoder.cls.predictions."
    renames = {
        "mlm_head.dense.": f"{head}transform.dense.",
        "mlm_head.layer_norm.": f"{head}transform.LayerNorm.",
    }
    for key, tensor in sd.items():
        if key.startswith("vision_encoder."):
            continue
        if key.startswith(("text_encoder.embeddings.", "text_encoder.encoder.")):
            if key == POSITION_KEY and bert_positions:
                tensor = torch.roll(tensor, shifts=-_position_offset(model), dims=0)
            out[f"text_encoder.{bert_prefix}{key[len('text_encoder.') :]}"] = tensor
        elif key.startswith("mlm_head."):
            for old, new in renames.items():
                if key.startswith(old):
                    out[new + key[len(old) :]] = tensor
        else:  # temp, vision_proj, text_proj, itm_head, vision_to_text (when it is a Linear)
            out[key] = tensor
    out[f"{head}decoder.weight"] = sd["mlm_head.decoder.weight"]
    # The bias the decoder really adds is the official (tied) ``predictions.bias``.
    out[f"{head}bias"] = sd["mlm_head.decoder.bias"]
    out[f"{head}decoder.bias"] = sd["mlm_head.decoder.bias"]
    return out
