"""Model configurations: JSON files under ``model_configs/`` read into dataclasses (as open_clip does)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

MODEL_CONFIG_DIR = Path(__file__).parent / "model_configs"
CCR10_LANGUAGES: tuple[str, ...] = ("en", "de", "fr", "cs", "ja", "zh", "es", "ru", "tr", "id")
# The pixel statistics the official CCRk code normalises with (CLIP's), not ImageNet's.
CLIP_MEAN: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
# The default of a config that names none (configs written before the presets named CLIP's).
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


class ConfigError(ValueError):
    """A model configuration is missing, malformed or inconsistent."""


@dataclass
class VisionConfig:
    """Image encoder built by timm.

    Attributes:
        backbone: any timm model name; the architecture is created without pretrained weights.
        image_size: square input size in pixels.
        backbone_kwargs: extra keyword arguments for ``timm.create_model`` (depths, embed_dim,
            window_size, ...).
        mean, std: per-channel normalisation applied to pixels in [0, 1]; ImageNet's when a config names
            none (the official CCRk code uses CLIP's: the ``ccrk-paper*`` presets name them).
        crop_pct: ``None`` resizes the whole image to the square input (CCRk's and CCLM's resize: the whole
            product stays visible); a fraction (timm's convention, e.g. 0.875) resizes the shorter side to
            ``image_size / crop_pct`` and takes the centre square, as ImageNet classifiers were evaluated.
    """

    backbone: str = "swin_base_patch4_window12_384"
    image_size: int = 384
    backbone_kwargs: dict[str, Any] = field(default_factory=dict)
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    crop_pct: float | None = None

    def __post_init__(self) -> None:
        if self.crop_pct is not None and not 0.0 < self.crop_pct <= 1.0:
            raise ConfigError(f"vision.crop_pct must be in (0, 1] or null, got {self.crop_pct}")
        # JSON has no tuples; normalise so a config equals itself after a save/load round trip.
        self.backbone_kwargs = {
            k: tuple(v) if isinstance(v, list) else v for k, v in self.backbone_kwargs.items()
        }
        self.mean, self.std = tuple(self.mean), tuple(self.std)


@dataclass
class TextConfig:
    """XLM-R style text stack: the first ``num_text_layers`` encode text, the next ``num_fusion_layers``
    add cross-attention over image tokens and form the fusion encoder.

    Attributes:
        vocab_size, hidden_size, num_attention_heads, intermediate_size, max_position_embeddings,
        type_vocab_size, pad_token_id, layer_norm_eps, hidden_act, hidden_dropout_prob,
        attention_probs_dropout_prob: as in ``transformers.XLMRobertaConfig``.
        max_length: tokenizer truncation length (must fit the position table, which XLM-R offsets by
            ``pad_token_id + 1``).
        pooling: how the retrieval embedding reads the text states: ``cls`` (the first token, as CCRk and
            its official checkpoints) or ``mean`` (over real tokens; learns far faster from scratch, which
            the small demo model needs).
    """

    vocab_size: int = 250002
    hidden_size: int = 1024
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    num_text_layers: int = 6
    num_fusion_layers: int = 6
    max_position_embeddings: int = 514
    type_vocab_size: int = 1
    pad_token_id: int = 1
    layer_norm_eps: float = 1e-5
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_length: int = 64
    pooling: str = "cls"

    def __post_init__(self) -> None:
        if self.pooling not in ("cls", "mean"):
            raise ConfigError(f"text.pooling must be 'cls' or 'mean', got {self.pooling!r}")


@dataclass
class CCRkConfig:
    """A whole CCRk model: dual encoder (image + text towers projected to ``embed_dim``), fusion encoder,
    ITM and MLM heads.

    Attributes:
        name: preset or model name, recorded in checkpoints and index manifests.
        embed_dim: size of the shared retrieval space.
        temperature_init: initial value of the learnable contrastive temperature.
        languages: languages the model was trained for (reported by the service).
    """

    # What ``model.model_dir.load_model_config`` dispatches on (a class constant: not written to config.json,
    # where its absence means a CCRk model).
    architecture: ClassVar[str] = "ccrk"
    name: str = "ccrk-paper"
    vision: VisionConfig = field(default_factory=VisionConfig)
    text: TextConfig = field(default_factory=TextConfig)
    embed_dim: int = 256
    temperature_init: float = 0.07
    languages: tuple[str, ...] = CCR10_LANGUAGES

    def __post_init__(self) -> None:
        if self.text.hidden_size % self.text.num_attention_heads:
            raise ConfigError(
                f"text.hidden_size {self.text.hidden_size} is not a multiple of "
                f"text.num_attention_heads {self.text.num_attention_heads}"
            )
        if self.text.max_length + self.text.pad_token_id + 1 > self.text.max_position_embeddings:
            raise ConfigError(
                f"text.max_length {self.text.max_length} does not fit max_position_embeddings "
                f"{self.text.max_position_embeddings} (XLM-R positions start at pad_token_id + 1)"
            )
        if not 0.0 < self.temperature_init < 1.0:
            raise ConfigError(f"temperature_init must be in (0, 1), got {self.temperature_init}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CCRkConfig:
        data = dict(data)
        try:
            vision = build_section(VisionConfig, data.pop("vision", {}), "vision")
            text = build_section(TextConfig, data.pop("text", {}), "text")
            top = build_kwargs(cls, data, "model", skip={"vision", "text"})
            return cls(vision=vision, text=text, **top)
        except TypeError as exc:  # wrong value types surface as TypeError from dataclass init
            raise ConfigError(str(exc)) from exc

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> CCRkConfig:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"model config not found: {path}") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"model config {path} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"model config {path} must hold a JSON object")
        return cls.from_dict(data)


def build_kwargs(cls: type, data: dict[str, Any], section: str, skip: set[str] | None = None) -> dict:
    """A config section's keyword arguments for dataclass ``cls``; unknown keys are named in a ConfigError."""
    known = {f.name for f in fields(cls)} - (skip or set())
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"unknown key(s) in {section} config: {sorted(unknown)}")
    out = {}
    for key, value in data.items():
        out[key] = tuple(value) if isinstance(value, list) else value
    return out


def build_section(cls: type, data: dict[str, Any], section: str) -> Any:
    """Dataclass ``cls`` from a config section (a JSON object)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{section} config must be an object")
    return cls(**build_kwargs(cls, data, section))


def list_presets() -> list[str]:
    return sorted(p.stem for p in MODEL_CONFIG_DIR.glob("*.json"))


def get_preset(name: str) -> CCRkConfig:
    """Load a preset by name (``demo``, ``ccrk-paper-224``, ``ccrk-paper``) or a config JSON by path."""
    path = Path(name)
    if path.suffix == ".json" and path.exists():
        return CCRkConfig.load(path)
    preset = MODEL_CONFIG_DIR / f"{name}.json"
    if not preset.exists():
        raise ConfigError(f"unknown model preset {name!r}; known presets: {', '.join(list_presets())}")
    return CCRkConfig.load(preset)
