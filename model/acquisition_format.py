"""Where a model directory keeps its acquired languages (``model.acquisition``), and their config; shared by
the trainer (torch) and the ONNX runtime (no torch), so neither imports the other.

Layout, beside the untouched base model files::

    languages/<lang>/acquirer.json         AcquirerConfig
    languages/<lang>/acquirer.safetensors  the new parameters only (embeddings, adapters)
    languages/<lang>/tokenizer.json        the language's own byte-level BPE (+ tokenizer_config.json)
    languages/<lang>/training.json         the training report (losses, steps, minutes, parameters added)
    onnx/text_encoder.<lang>.onnx          the acquirer path: (input_ids, attention_mask) ->
                                           (text_embeds, text_states), as onnx/text_encoder.onnx
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from model.configs import ConfigError, build_kwargs

LANGUAGES_DIR = "languages"
ACQUIRER_CONFIG = "acquirer.json"
ACQUIRER_WEIGHTS = "acquirer.safetensors"
ACQUIRER_TOKENIZER = "tokenizer.json"
TRAINING_REPORT = "training.json"
FORMAT_VERSION = 1
# A language code as a folder name: ISO 639 letters, optionally a BCP 47 subtag (``pt-BR``, ``zh-Hant``).
_LANG_CODE = re.compile(r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})?$")


def check_language_code(lang: str) -> str:
    if not _LANG_CODE.match(lang):
        raise ConfigError(f"{lang!r} is not a language code (expected e.g. 'ko', 'pt-BR')")
    return lang


def acquirer_graph_name(lang: str) -> str:
    """The ONNX graph of a language's acquisition encoder, under ``onnx/``."""
    return f"text_encoder.{check_language_code(lang)}.onnx"


@dataclass
class AcquirerConfig:
    """One language acquisition encoder (MLA) added to a frozen model.

    Attributes:
        lang: the language it encodes.
        native: the model's languages its NLT stage distilled from (the source side of the pairs).
        base_model: the base config's ``name``; base_fingerprint:
        ``store.version.manifest.model_fingerprint`` of the
            base directory, which the runtimes check, so an acquirer never serves under other weights.
        hidden_size, num_text_layers, pooling: the base text tower's, checked on load.
        vocab_size: the size of the language's own tokenizer (as trained: BPE stops early on a small corpus).
        max_length: truncation length; positions are the base model's frozen ones, so it fits the base's.
        bottleneck: width of each adapter (language acquirer) after a frozen text layer.
        activation: the adapters' non-linearity.
        embedding_init: ``random`` or ``base-pieces`` (each new token starts as the mean of the base
            embeddings of the pieces the base tokenizer cuts it into).
        steps_nlt, steps_le: optimizer steps of the two stages; seed: everything is seeded from it.
        onnx_graph: file under ``onnx/`` (None when the base model has no ONNX export).
    """

    lang: str
    native: tuple[str, ...]
    base_model: str
    base_fingerprint: str
    hidden_size: int
    num_text_layers: int
    pooling: str
    vocab_size: int
    max_length: int
    bottleneck: int
    activation: str = "gelu"
    embedding_init: str = "random"
    steps_nlt: int = 0
    steps_le: int = 0
    seed: int = 0
    onnx_graph: str | None = None
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        check_language_code(self.lang)
        self.native = tuple(self.native)
        if self.bottleneck < 1 or self.vocab_size < 1 or self.max_length < 2:
            raise ConfigError(
                f"acquirer {self.lang}: bottleneck, vocab_size and max_length must be positive "
                f"(got {self.bottleneck}, {self.vocab_size}, {self.max_length})"
            )
        if self.embedding_init not in ("base-pieces", "random"):
            raise ConfigError(
                f"embedding_init must be 'base-pieces' or 'random', got {self.embedding_init!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> AcquirerConfig:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"acquirer config not found: {path}") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"acquirer config {path} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"acquirer config {path} must hold a JSON object")
        try:
            return cls(**build_kwargs(cls, data, f"acquirer ({path})"))
        except TypeError as exc:  # a missing key or a wrong value type
            raise ConfigError(f"acquirer config {path}: {exc}") from exc


def acquirer_dirs(model_dir: Path | str) -> dict[str, Path]:
    """Language -> ``languages/<lang>/`` of every acquirer of a model directory (those with a config)."""
    root = Path(model_dir) / LANGUAGES_DIR
    if not root.is_dir():
        return {}
    return {d.name: d for d in sorted(root.iterdir()) if (d / ACQUIRER_CONFIG).is_file()}


def acquired_languages(model_dir: Path | str) -> tuple[str, ...]:
    """The languages a model directory has acquirers for (not its native ``config.languages``)."""
    return tuple(acquirer_dirs(model_dir))


def acquirers_digest(model_dir: Path | str) -> str | None:
    """sha256 over every acquirer's config and weights (None without any): adding or retraining a language
    leaves the model's fingerprint as it is (the image tower is untouched), but changes how queries of that
    language encode, so caches of query embeddings and results key on this too."""
    found = acquirer_dirs(model_dir)
    if not found:
        return None
    h = hashlib.sha256()
    for lang, folder in sorted(found.items()):
        h.update(lang.encode() + b"\0")
        for name in (ACQUIRER_CONFIG, ACQUIRER_WEIGHTS):
            h.update((Path(folder) / name).read_bytes())
    return h.hexdigest()


def foreign_base(config: AcquirerConfig, lang_dir: Path, model_dir: Path, fingerprint: str) -> str | None:
    """Why an acquirer must not serve over the model in ``model_dir`` (its ``fingerprint``): it was trained
    over other weights. None when it fits. Both runtimes refuse such an acquirer with this message."""
    if config.base_fingerprint == fingerprint:
        return None
    return (
        f"the {config.lang} acquirer ({lang_dir}) was trained over other weights than {model_dir}'s "
        f"(fingerprint {config.base_fingerprint[:12]}, the model's {fingerprint[:12]})"
    )
