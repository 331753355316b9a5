"""MLA's language acquisition encoder (Zhang, Hu, Jin, "Generalizing Multimodal Pre-training into
Multilingual via Language Acquisition"): a new language is added to a frozen CCRk model without touching its
weights, so no image has to be embedded again and the model's fingerprint stays the same.

The acquisition encoder of a language is the frozen text tower with two additions, trained alone:

- a **non-native embedding block**: the language's own word embeddings (its own vocabulary), the base
  model's **frozen** position and token-type embeddings, and a new LayerNorm initialised from the frozen one.
  Positions are shared, not new: they carry no language, the frozen layers' attention was trained on exactly
  these vectors, and re-learning 64 of them from a few thousand sentences would only add noise.
  The word embeddings start random (std 0.02, BERT's initialisation). ``embedding_init="base-pieces"``
  starts each new token at the mean base embedding of the pieces the base tokenizer cuts it into; measured
  on the demo model (NLT only, test IR R@1 after 50 / 150 steps) it does not help, even for Italian, whose
  pieces the base model knows: ko 0.685 / 0.885 against random's 0.808 / 0.907, it 0.810 / 0.887 against
  0.823 / 0.893.
- **language acquirers**: a bottleneck adapter after each frozen text layer (down-projection to
  ``bottleneck``, GELU, up-projection, residual); the up-projection starts at zero, so an untrained acquirer
  passes the frozen layer's states through unchanged.

Pooling and ``text_proj`` are the frozen ones, and the states stay in the frozen hidden space, so the frozen
fusion encoder can re-rank the new language's queries as it does the others'.

The vocabulary is the language's own byte-level BPE (``train_tokenizer(..., marks_in_words=True)``) because
the shared byte-level tokenizer spends 2-3 byte pieces on each Hangul, Arabic or Devanagari character.
Measured on the synthetic catalogue's test captions (200 items x 2 phrasings, full attribute mentions),
tokens per caption with ``<s>``/``</s>``, the demo model's shared tokenizer (vocab 4000) -> the language's own
(trained on 2,000 training items' captions; BPE stops at ~500 tokens on this small lexicon): ko 84.0 -> 12.0,
ar 110.7 -> 12.8, hi 164.8 -> 14.7, it 36.3 -> 15.0 (en, for scale: 15.7). With the shared tokenizer every
ko, ar and hi test caption overflows max_length 64 and is cut; with its own none does. (GPT-2's word pattern
alone would give hi 45.9: it splits Devanagari words at every vowel sign, hence ``marks_in_words``.)

Per language the demo model (2.07 M parameters, hidden 128, 2 text layers) gains about 0.1 M: ~500 x 128
word embeddings, a LayerNorm, and two adapters of bottleneck 64 (2 x 16,576).

``model.language_training`` trains an acquirer (NLT, then LE; or CL2CM's objectives, ``model.cl2cm``);
``model.add_language`` writes it into a model directory (layout in ``model.acquisition_format``); the runtimes
route texts of an acquired language through it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedTokenizerBase

from model.acquisition_format import (
    ACQUIRER_CONFIG,
    ACQUIRER_WEIGHTS,
    TRAINING_REPORT,
    AcquirerConfig,
)
from model.configs import ConfigError
from model.export import export_graph
from model.modeling import (
    CCRkModel,
    CheckpointError,
    TextEncoderOutput,
    additive_attention_mask,
    pool_text_states,
)
from model.tokenization import TokenizerError, load_tokenizer, train_tokenizer

_ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}


class Adapter(nn.Module):
    """A language acquirer: ``h + up(act(down(h)))``; ``up`` starts at zero (an identity at first)."""

    def __init__(self, hidden: int, bottleneck: int, activation: str = "gelu") -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ConfigError(f"unknown adapter activation {activation!r}; one of {sorted(_ACTIVATIONS)}")
        self.down = nn.Linear(hidden, bottleneck)
        self.act = _ACTIVATIONS[activation]()
        self.up = nn.Linear(bottleneck, hidden)
        nn.init.normal_(self.down.weight, std=0.02)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.up(self.act(self.down(hidden)))


class LanguageAcquirer(nn.Module):
    """The new parameters of one language (embeddings, LayerNorm, one adapter per text layer) over a frozen
    ``CCRkModel``.

    The base model is held outside the module tree (``self.base``), so ``parameters()`` and ``state_dict()``
    are the new parameters only, and ``train()`` never switches on the frozen model's dropout.
    """

    def __init__(self, config: AcquirerConfig, base: CCRkModel) -> None:
        super().__init__()
        text = base.config.text
        if (config.hidden_size, config.num_text_layers, config.pooling) != (
            text.hidden_size,
            text.num_text_layers,
            text.pooling,
        ):
            raise ConfigError(
                f"acquirer {config.lang} was built for hidden {config.hidden_size}, "
                f"{config.num_text_layers} text layers, {config.pooling} pooling; the base model "
                f"{base.config.name!r} has {text.hidden_size}, {text.num_text_layers}, {text.pooling}"
            )
        if config.max_length + text.pad_token_id + 1 > text.max_position_embeddings:
            raise ConfigError(
                f"acquirer max_length {config.max_length} does not fit the base position table "
                f"({text.max_position_embeddings})"
            )
        self.config = config
        self._base = (base,)  # a tuple: not registered as a submodule
        frozen = base.text_encoder.embeddings
        self.word_embeddings = nn.Embedding(
            config.vocab_size, text.hidden_size, padding_idx=text.pad_token_id
        )
        nn.init.normal_(self.word_embeddings.weight, std=0.02)
        with torch.no_grad():
            self.word_embeddings.weight[text.pad_token_id].zero_()
        self.layer_norm = nn.LayerNorm(text.hidden_size, eps=text.layer_norm_eps)
        self.layer_norm.load_state_dict(frozen.LayerNorm.state_dict())
        self.adapters = nn.ModuleList(
            Adapter(text.hidden_size, config.bottleneck, config.activation)
            for _ in range(text.num_text_layers)
        )

    @property
    def base(self) -> CCRkModel:
        return self._base[0]

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The non-native embedding block: own word embeddings + frozen positions (XLM-R's numbering:
        padding keeps ``pad_token_id``, real tokens count from ``pad_token_id + 1``) + frozen token type."""
        frozen = self.base.text_encoder.embeddings
        pad = self.base.config.text.pad_token_id
        real = input_ids.ne(pad).long()
        positions = torch.cumsum(real, dim=1) * real + pad
        hidden = (
            self.word_embeddings(input_ids)
            + frozen.token_type_embeddings.weight[0]
            + frozen.position_embeddings(positions)
        )
        return self.layer_norm(hidden)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(states (B, L, H), pooled (B, H) before ``text_proj``, embeds (B, D) normalised)."""
        base = self.base
        hidden = self.embed(input_ids)
        mask = additive_attention_mask(attention_mask, hidden.dtype)
        layers = base.text_encoder.encoder.layer[: base.config.text.num_text_layers]
        for layer, adapter in zip(layers, self.adapters, strict=True):
            hidden = adapter(layer(hidden, attention_mask=mask))
        pooled = pool_text_states(hidden, attention_mask, base.config.text.pooling)
        return hidden, pooled, F.normalize(base.text_proj(pooled), dim=-1)

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TextEncoderOutput:
        """As ``CCRkModel.encode_text``: states in the frozen hidden space, for the frozen fusion encoder."""
        hidden, _, embeds = self(input_ids, attention_mask)
        return TextEncoderOutput(last_hidden_state=hidden, attention_mask=attention_mask, text_embeds=embeds)


def freeze(model: CCRkModel) -> CCRkModel:
    """Eval mode (no dropout) and no gradients: the base model of an acquirer never changes."""
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def train_language_tokenizer(
    texts: Sequence[str], vocab_size: int, max_length: int
) -> PreTrainedTokenizerBase:
    """The language's own byte-level BPE with XLM-R's special tokens (``<pad>`` = 1, as the base's)."""
    if not texts:
        raise ValueError("no text to train the language's tokenizer on")
    return train_tokenizer(texts, vocab_size, max_length, marks_in_words=True)


def _base_piece_ids(
    token: str, tokenizer: PreTrainedTokenizerBase, base_tokenizer: PreTrainedTokenizerBase
) -> list[int]:
    """The base tokenizer's ids for one token of the new vocabulary. Byte-level tokens are matched byte for
    byte through the base BPE model when it is byte-level too (a token may be half a character); otherwise
    the token's text is tokenized."""
    backend = getattr(base_tokenizer, "backend_tokenizer", None)
    if backend is not None and type(backend.model).__name__ == "BPE" and "Ġ" in base_tokenizer.get_vocab():
        return [t.id for t in backend.model.tokenize(token)]
    text = tokenizer.convert_tokens_to_string([token]).strip()
    return list(base_tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


@torch.no_grad()
def init_embeddings_from_base(
    acquirer: LanguageAcquirer, tokenizer: PreTrainedTokenizerBase, base_tokenizer: PreTrainedTokenizerBase
) -> int:
    """Each new token's embedding := the mean base embedding of its base pieces (special tokens: the base's
    own). Returns how many tokens were initialised so (the rest keep their random start)."""
    base_weight = acquirer.base.text_encoder.embeddings.word_embeddings.weight
    special = set(tokenizer.all_special_tokens)
    base_vocab = base_tokenizer.get_vocab()
    done = 0
    for token, index in tokenizer.get_vocab().items():
        if index == acquirer.base.config.text.pad_token_id:
            continue
        if token in special:
            ids = [base_vocab[token]] if token in base_vocab else []
        else:
            ids = [i for i in _base_piece_ids(token, tokenizer, base_tokenizer) if i < base_weight.shape[0]]
        if ids:
            acquirer.word_embeddings.weight[index] = base_weight[ids].mean(dim=0)
            done += 1
    return done


# -- persistence ------------------------------------------------------------------------------------------


def save_acquirer(
    lang_dir: Path, acquirer: LanguageAcquirer, tokenizer: PreTrainedTokenizerBase, report: dict[str, Any]
) -> None:
    """Write ``acquirer.json``, ``acquirer.safetensors``, the tokenizer and ``training.json``."""
    lang_dir.mkdir(parents=True, exist_ok=True)
    acquirer.config.save(lang_dir / ACQUIRER_CONFIG)
    state = {k: v.detach().contiguous().cpu() for k, v in acquirer.state_dict().items()}
    weights = lang_dir / ACQUIRER_WEIGHTS
    safetensors.torch.save_file(state, str(weights), metadata={"lang": acquirer.config.lang})
    weights.chmod(0o644)  # safetensors writes 0600; a service under another user must read it
    tokenizer.save_pretrained(str(lang_dir))
    (lang_dir / TRAINING_REPORT).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", "utf-8")


def load_acquirer(
    lang_dir: Path, base: CCRkModel, map_location: str | torch.device = "cpu"
) -> tuple[LanguageAcquirer, PreTrainedTokenizerBase]:
    """An acquirer over ``base`` (which it does not change) and its tokenizer, in eval mode."""
    try:
        config = AcquirerConfig.load(lang_dir / ACQUIRER_CONFIG)
        acquirer = LanguageAcquirer(config, base)
        tokenizer = load_tokenizer(lang_dir)
    except (ConfigError, TokenizerError) as exc:
        raise CheckpointError(str(exc)) from exc
    weights = lang_dir / ACQUIRER_WEIGHTS
    try:
        state = safetensors.torch.load_file(str(weights), device=str(map_location))
        acquirer.load_state_dict(state)
    except (OSError, RuntimeError, safetensors.SafetensorError) as exc:
        raise CheckpointError(f"cannot load the acquirer weights {weights}: {exc}") from exc
    return acquirer.to(map_location).eval(), tokenizer


# -- ONNX -------------------------------------------------------------------------------------------------


class _AcquirerGraph(nn.Module):
    """The acquirer path with the base registered too, so the tracer sees its weights as parameters."""

    def __init__(self, acquirer: LanguageAcquirer) -> None:
        super().__init__()
        self.acquirer = acquirer
        self.base = acquirer.base

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.acquirer.encode_text(input_ids, attention_mask)
        return out.text_embeds, out.last_hidden_state


@torch.no_grad()
def export_acquirer_onnx(acquirer: LanguageAcquirer, path: Path) -> Path:
    """The acquirer path as ``onnx/text_encoder.onnx`` is the base's: inputs ``input_ids``,
    ``attention_mask``; outputs ``text_embeds``, ``text_states``; batch and sequence axes dynamic."""
    acquirer = acquirer.eval().cpu()
    pad = acquirer.base.config.text.pad_token_id
    ids = torch.tensor([[0, 5, 6, 7, 2], [0, 8, 2, pad, pad]], dtype=torch.long)
    ids = ids.clamp(max=acquirer.config.vocab_size - 1)
    mask = (ids != pad).long()
    export_graph(
        _AcquirerGraph(acquirer),
        (ids, mask),
        path,
        ["input_ids", "attention_mask"],
        ["text_embeds", "text_states"],
        {
            "input_ids": {0: "batch", 1: "sequence"},
            "attention_mask": {0: "batch", 1: "sequence"},
            "text_embeds": {0: "batch"},
            "text_states": {0: "batch", 1: "sequence"},
        },
    )
    return path
