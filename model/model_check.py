"""One check of a model directory before any build or serve work starts: every file the runtime will open is
read, every ONNX graph is loaded and run once on a blank input, and what they hold is compared with what
``config.json`` states (image size, embedding width, known language codes). A damaged directory is refused
with a ``ModelDirError`` naming the file, so ``ccrk index build`` and ``ccrk serve`` exit 2 with that name
before they create anything (a truncated graph, a garbage ``tokenizer.json`` or an edited ``image_size``
gave an ONNX Runtime or tokenizer traceback; an edited ``embed_dim`` left a ``build-*`` folder behind;
unknown language codes were published).

Loading the graphs here and again in the runtime costs one more load at start (0.3 s for the demo model).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import langcodes
import numpy as np

from model.acquisition_format import ACQUIRER_CONFIG, ACQUIRER_TOKENIZER, AcquirerConfig, acquirer_dirs
from model.configs import CCRkConfig, ConfigError
from model.model_dir import load_model_config
from model.onnx_format import EXPORT_MANIFEST, ONNX_DIR
from model.starter.config import IMAGE_GRAPH as STARTER_IMAGE_GRAPH
from model.starter.config import ConSEConfig

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
# Valid BCP 47 tags that name no language.
NO_LANGUAGE = frozenset({"und", "mul", "zxx", "mis"})


class ModelDirError(ConfigError):
    """A file of a model directory cannot be used; ``path`` is that file."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


def known_language(code: object) -> bool:
    """A language code the IANA registry knows (``en``, ``pt-BR``, ``zh-Hant``), not ``und``-like."""
    return (
        isinstance(code, str)
        and code.lower() not in NO_LANGUAGE
        and not code.lower().startswith("x-")
        and langcodes.tag_is_valid(code)
    )


def check_model_dir(model_dir: Path | str, *, backend: str = "onnx", int8: bool = False) -> None:
    """Refuse a model directory the runtime could not serve (``ModelDirError`` naming the file): its
    config, its languages, its tokenizers, and with ``backend`` onnx every graph it would load (the int8
    ones too when ``int8``), loaded, of the shapes the config states, and run once."""
    model_dir = Path(model_dir)
    config_path = model_dir / CONFIG_FILE
    try:
        config = load_model_config(model_dir)
    except ConfigError as exc:
        raise ModelDirError(config_path, _without(str(exc), config_path)) from None
    unknown = [code for code in config.languages if not known_language(code)]
    if unknown:
        raise ModelDirError(config_path, f"unknown language code(s) {unknown} in 'languages'")
    if isinstance(config, ConSEConfig):
        graph = model_dir / STARTER_IMAGE_GRAPH
        session = _session(graph)
        _check_image_graph(session, graph, config.vision.image_size, None, config_path)
        return
    assert isinstance(config, CCRkConfig)
    _tokenizer(model_dir / TOKENIZER_FILE)
    acquirers = _acquirers(model_dir)
    if backend != "onnx":
        return
    onnx_dir = model_dir / ONNX_DIR
    manifest_path = onnx_dir / EXPORT_MANIFEST
    manifest = _json(manifest_path)
    graphs = manifest.get("graphs")
    if not isinstance(graphs, dict) or not {"text", "image", "fusion"} <= set(graphs):
        raise ModelDirError(manifest_path, "'graphs' must name the text, image and fusion graphs")
    for key, stated in (("embed_dim", config.embed_dim), ("image_size", config.vision.image_size)):
        if key in manifest and manifest[key] != stated:
            raise ModelDirError(
                config_path,
                f"says {key} {stated}; the ONNX graphs were exported with {key} {manifest[key]} "
                f"({manifest_path})",
            )
    files = dict(graphs)
    if int8:
        files.update(manifest.get("int8_graphs") or {})
    d, size = config.embed_dim, config.vision.image_size
    image = onnx_dir / str(files["image"])
    tokens = _check_image_graph(_session(image), image, size, d, config_path)
    text = onnx_dir / str(files["text"])
    states = _check_text_graph(_session(text), text, d, config_path)
    fusion = onnx_dir / str(files["fusion"])
    _check_fusion_graph(_session(fusion), fusion, states, tokens)
    for lang, acquirer in acquirers.items():
        graph = onnx_dir / (acquirer.onnx_graph or f"text_encoder.{lang}.onnx")
        if not graph.is_file():
            raise ModelDirError(graph, f"the {lang} acquirer's graph is missing; add the language again")
        _check_text_graph(_session(graph), graph, d, config_path)


def _without(message: str, path: Path) -> str:
    """A config error's message without the path it already names (the ModelDirError adds it in front)."""
    for form in (f"model config {path} ", f"{path}: ", f"model config not found: {path}"):
        message = message.replace(form, "")
    return message or "not found"


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelDirError(path, "missing") from None
    except (OSError, ValueError) as exc:
        raise ModelDirError(path, f"cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelDirError(path, "must hold a JSON object")
    return data


def _tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer

    if not path.is_file():
        raise ModelDirError(path, "missing")
    try:
        Tokenizer.from_file(str(path)).encode("check")
    except Exception as exc:  # the tokenizers library raises plain Exception for a file it cannot parse
        raise ModelDirError(path, f"is not a tokenizer file: {str(exc)[:200]}") from None


def _acquirers(model_dir: Path) -> dict[str, AcquirerConfig]:
    found = {}
    for lang, folder in acquirer_dirs(model_dir).items():
        path = folder / ACQUIRER_CONFIG
        if not known_language(lang):
            raise ModelDirError(folder, f"{lang!r} is not a known language code")
        try:
            found[lang] = AcquirerConfig.load(path)
        except ConfigError as exc:
            raise ModelDirError(path, _without(str(exc), path)) from None
        if found[lang].lang != lang:
            raise ModelDirError(path, f"'lang' is {found[lang].lang!r}, its folder is {lang!r}")
        _tokenizer(folder / ACQUIRER_TOKENIZER)
    return found


def _session(path: Path) -> Any:
    import onnxruntime as ort

    if not path.is_file():
        raise ModelDirError(path, "missing")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # its errors are raised, not logged
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ONNX Runtime's own exception classes (InvalidProtobuf, Fail, ...)
        reason = str(exc).replace(str(path), "the file")
        raise ModelDirError(path, f"is not a loadable ONNX graph: {reason[:300]}") from None


def _last_dim(shape: list[Any]) -> int | None:
    return shape[-1] if shape and isinstance(shape[-1], int) else None


def _run(session: Any, path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    try:
        return session.run(None, feeds)
    except Exception as exc:  # a graph that loads but cannot run on the inputs its config states
        reason = str(exc).replace(str(path), "the file")
        raise ModelDirError(path, f"does not run on a blank input: {reason[:300]}") from None


def _check_image_graph(session: Any, path: Path, size: int, d: int | None, config_path: Path) -> int | None:
    """The image graph takes (N, 3, size, size) and gives (N, d) embeddings; its token width (or None)."""
    (pixels,) = session.get_inputs()
    stated = pixels.shape[1:]
    want = (3, size, size)
    if len(stated) != 3 or any(isinstance(v, int) and v != w for v, w in zip(stated, want, strict=True)):
        raise ModelDirError(
            path, f"takes pixels of shape {pixels.shape}; {config_path} says image_size {size}"
        )
    outputs = _run(session, path, {pixels.name: np.zeros((1, 3, size, size), dtype=np.float32)})
    if d is not None and outputs[0].shape != (1, d):
        raise ModelDirError(
            path, f"gives embeddings of width {outputs[0].shape[-1]}; {config_path} says embed_dim {d}"
        )
    return outputs[1].shape[-1] if len(outputs) > 1 else None


def _check_text_graph(session: Any, path: Path, d: int, config_path: Path) -> int | None:
    """The text graph gives (N, d) embeddings; its states' width (or None)."""
    feeds = {i.name: np.ones((1, 4), dtype=np.int64) for i in session.get_inputs()}
    outputs = _run(session, path, feeds)
    if outputs[0].shape != (1, d):
        raise ModelDirError(
            path, f"gives embeddings of width {outputs[0].shape[-1]}; {config_path} says embed_dim {d}"
        )
    return outputs[1].shape[-1] if len(outputs) > 1 else None


def _check_fusion_graph(session: Any, path: Path, states: int | None, tokens: int | None) -> None:
    """The fusion graph takes the text graph's states and the image graph's tokens."""
    for name, width in (("text_states", states), ("image_tokens", tokens)):
        found = next((i for i in session.get_inputs() if i.name == name), None)
        if found is None:
            raise ModelDirError(path, f"has no input {name!r}")
        stated = _last_dim(found.shape)
        if width is not None and stated is not None and stated != width:
            raise ModelDirError(path, f"takes {name} of width {stated}; the other graphs give {width}")
