"""What kind of model a directory holds, read from its ``config.json``: a CCRk model (dual + fusion
encoder) or a ConSE starter model (``"architecture": "conse"``). Both configs carry what the indexer and the
service read (``name``, ``vision``, ``embed_dim``, ``languages``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Re-exported: the languages a directory has acquirers for, beside the native ``config.languages``.
from model.acquisition_format import acquired_languages as acquired_languages
from model.configs import CCRkConfig, ConfigError
from model.starter.config import ARCHITECTURE as CONSE
from model.starter.config import ConSEConfig

ModelConfig = CCRkConfig | ConSEConfig


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"model config not found: {path}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"model config {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"model config {path} must hold a JSON object")
    return data


def load_model_config(model_dir: Path | str) -> ModelConfig:
    """The config of the model in ``model_dir`` (or of a ``config.json`` path), of the kind it declares."""
    path = Path(model_dir)
    if path.is_dir():
        path = path / "config.json"
    data = _read_json(path)
    if data.get("architecture") == CONSE:
        return ConSEConfig.from_dict(data)
    if "architecture" in data:
        raise ConfigError(
            f"{path}: unknown architecture {data['architecture']!r} (known: {CONSE!r}, or none)"
        )
    return CCRkConfig.from_dict(data)


def declared_architecture(model_dir: Path | str) -> str:
    """``conse`` when the directory's config.json declares it, else ``ccrk`` (also for a missing or broken
    file: the CCRk runtimes then say what is wrong with the directory)."""
    try:
        data = _read_json(Path(model_dir) / "config.json")
    except (ConfigError, OSError):
        return CCRkConfig.architecture
    return CONSE if data.get("architecture") == CONSE else CCRkConfig.architecture
