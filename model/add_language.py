"""``add_language``: teach a frozen model directory a new language (MLA, ``model.acquisition``) and write the
result as a model directory that every index built with the original still fits.

The output is a copy of the original whose files are byte-identical (copied, never re-saved: config.json,
model.safetensors, tokenizer, ``onnx/*``, so ``store.version.manifest.model_fingerprint`` is the same and no
image is
embedded again) plus ``languages/<lang>/`` and ``onnx/text_encoder.<lang>.onnx`` (layout:
``model.acquisition_format``). A directory that already has acquired languages keeps them; adding a second
language adds a second ``languages/<lang2>/``.

Data: ``parallel``, a TSV ``native<TAB>new`` (or ``ParallelCorpus``'s jsonl) for NLT; ``captions``, a
catalogue jsonl (or a folder: its ``train.jsonl``) whose records have ``captions[lang]`` and ``image``, for
LE.
Without ``parallel``, NLT pairs come from the catalogue when its records also have captions in ``native``
(the same phrasing slot in both languages says the same thing). The LE records' ``native`` captions are kept
too (``LanguageData.native_captions``): CL2CM's distillation (``LanguageTrainConfig.objective``) reads them.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from model.acquisition import export_acquirer_onnx, save_acquirer
from model.acquisition_format import (
    LANGUAGES_DIR,
    acquired_languages,
    acquirer_graph_name,
    check_language_code,
)
from model.configs import CCRkConfig, ConfigError
from model.language_training import LanguageData, LanguageTrainConfig, Log, train_acquirer
from model.model_dir import load_model_config
from model.modeling import CONFIG_FILE, WEIGHTS_FILE, CCRkModel, CheckpointError
from model.onnx_format import EXPORT_MANIFEST, ONNX_DIR
from model.parallel_corpus import ParallelCorpus, ParallelCorpusError, pairs_from_catalogue
from model.preprocessing import ImageDecodeError, ImagePreprocessor
from model.tokenization import TokenizerError, load_tokenizer
from model.training_data import CaptionedImages
from store.version.manifest import model_fingerprint
from synthetic.catalogue import CatalogueFormatError, CatalogueRecord, load_split


class AddLanguageError(ValueError):
    """A language cannot be added: bad arguments or data; the message names the file or the option."""


@dataclass
class AddLanguageResult:
    out: Path
    lang: str
    lang_dir: Path
    onnx_graph: Path | None
    report: dict[str, Any]


def _catalogue_split(path: Path) -> Path:
    split = path / "train.jsonl" if path.is_dir() else path
    if not split.is_file():
        raise AddLanguageError(f"captions file not found: {split}")
    return split


def _load_records(split: Path) -> list[CatalogueRecord]:
    try:
        return load_split(split)
    except CatalogueFormatError as exc:
        raise AddLanguageError(str(exc)) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise AddLanguageError(f"cannot read captions file {split}: {exc}") from exc


def _captioned_images(
    records: list[CatalogueRecord], lang: str, split: Path, preprocessor: ImagePreprocessor
) -> CaptionedImages:
    picked = [r for r in records if r.captions.get(lang)]
    if len(picked) < 2:
        raise AddLanguageError(
            f"{split}: {len(picked)} records have captions in {lang!r}; LE needs at least 2"
        )
    try:
        pixels = preprocessor.load_many_uint8([r.image for r in picked])
    except ImageDecodeError as exc:
        raise AddLanguageError(f"{split}: {exc}") from exc
    keys = [json.dumps(r.attributes, sort_keys=True) if r.attributes else r.id for r in picked]
    return CaptionedImages(
        ids=[r.id for r in picked],
        pixels=torch.from_numpy(pixels),
        captions=[{lang: list(r.captions[lang])} for r in picked],
        languages=(lang,),
        item_keys=keys,
    )


def load_language_data(
    lang: str,
    native: str,
    preprocessor: ImagePreprocessor,
    parallel: Path | None = None,
    captions: Path | None = None,
    pairs_per_record: int = 4,
    seed: int = 0,
) -> LanguageData:
    """The NLT pairs and LE images of ``lang``; errors name the file at fault."""
    if parallel is None and captions is None:
        raise AddLanguageError("give parallel sentences (--parallel) and/or captioned images (--captions)")
    sources: dict[str, str] = {}
    pairs: list[tuple[str, str]] = []
    if parallel is not None:
        try:
            pairs = ParallelCorpus.load(Path(parallel)).pairs
        except ParallelCorpusError as exc:
            raise AddLanguageError(str(exc)) from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise AddLanguageError(f"cannot read parallel corpus {parallel}: {exc}") from exc
        sources["parallel"] = str(parallel)
    images = None
    native_captions = None
    if captions is not None:
        split = _catalogue_split(Path(captions))
        records = _load_records(split)
        images = _captioned_images(records, lang, split, preprocessor)
        sources["captions"] = str(split)
        picked = [r for r in records if r.captions.get(lang)]
        if all(r.captions.get(native) for r in picked):  # CL2CM's teacher reads the native side
            native_captions = [list(r.captions[native]) for r in picked]
        if parallel is None:
            pairs = pairs_from_catalogue(records, pairs_per_record, seed, source=native, target=lang)
            sources["parallel"] = f"{split} ({native} and {lang} captions of the same records)"
    return LanguageData(
        lang=lang,
        native=(native,),
        pairs=pairs,
        captions=images,
        sources=sources,
        native_captions=native_captions,
    )


def _check_out(model_dir: Path, out: Path | None) -> Path:
    if out is None or out.resolve() == model_dir.resolve():
        return model_dir
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise AddLanguageError(f"--out {out} exists and is not empty; give a new folder")
    return out


def _base_config(model_dir: Path) -> CCRkConfig:
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (model_dir / name).is_file():
            raise AddLanguageError(f"{model_dir} is not a model directory: {name} is missing")
    try:
        config = load_model_config(model_dir)
    except ConfigError as exc:
        raise AddLanguageError(str(exc)) from exc
    if not isinstance(config, CCRkConfig):
        raise AddLanguageError(f"{model_dir} is a starter model: languages are added to CCRk models only")
    return config


def check_new_language(model_dir: Path, lang: str, native: str) -> CCRkConfig:
    """The base config, once ``lang`` is known to be new to it and ``native`` known to it."""
    config = _base_config(model_dir)
    try:
        check_language_code(lang)
    except ConfigError as exc:
        raise AddLanguageError(str(exc)) from exc
    if lang in config.languages:
        raise AddLanguageError(
            f"{model_dir} already has {lang!r} natively (its languages: {', '.join(config.languages)})"
        )
    if lang in acquired_languages(model_dir):
        raise AddLanguageError(f"{model_dir} already has an acquirer for {lang!r} ({LANGUAGES_DIR}/{lang}/)")
    if native not in config.languages:
        raise AddLanguageError(
            f"--native {native!r} is not one of the model's languages ({', '.join(config.languages)})"
        )
    return config


def add_language(
    model_dir: Path | str,
    lang: str,
    *,
    parallel: Path | str | None = None,
    captions: Path | str | None = None,
    out: Path | str | None = None,
    native: str = "en",
    config: LanguageTrainConfig | None = None,
    log: Log = print,
) -> AddLanguageResult:
    """Train ``lang``'s acquirer over the frozen model in ``model_dir`` and write ``out`` (a byte-identical
    copy of ``model_dir`` plus the language); ``out`` None (or ``model_dir``) adds it in place."""
    model_dir = Path(model_dir)
    cfg = config or LanguageTrainConfig()
    base_config = check_new_language(model_dir, lang, native)
    target = _check_out(model_dir, Path(out) if out is not None else None)
    data = load_language_data(
        lang,
        native,
        ImagePreprocessor(base_config.vision),
        Path(parallel) if parallel is not None else None,
        Path(captions) if captions is not None else None,
        seed=cfg.seed,
    )
    try:
        base = CCRkModel.from_pretrained(model_dir)
        base_tokenizer = load_tokenizer(model_dir)
    except (CheckpointError, TokenizerError) as exc:
        raise AddLanguageError(str(exc)) from exc
    fingerprint = model_fingerprint(model_dir)
    try:
        result = train_acquirer(base, base_tokenizer, data, cfg, fingerprint, log)
    except ValueError as exc:
        raise AddLanguageError(str(exc)) from exc

    staging = target if target == model_dir else target.parent / f".{target.name}.tmp-{os.getpid()}"
    if staging != model_dir:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(model_dir, staging, symlinks=False)  # copy2: bytes and mtimes as they are
    graph = None
    if (staging / ONNX_DIR / EXPORT_MANIFEST).is_file():
        result.acquirer.config.onnx_graph = acquirer_graph_name(lang)
        graph = export_acquirer_onnx(result.acquirer, staging / ONNX_DIR / result.acquirer.config.onnx_graph)
    lang_tmp = staging / LANGUAGES_DIR / f".{lang}.tmp"
    shutil.rmtree(lang_tmp, ignore_errors=True)
    save_acquirer(lang_tmp, result.acquirer, result.tokenizer, result.report)
    lang_dir = staging / LANGUAGES_DIR / lang
    lang_tmp.replace(lang_dir)
    if staging != model_dir:
        if target.exists():
            target.rmdir()  # checked empty above
        staging.replace(target)
        graph = target / ONNX_DIR / graph.name if graph is not None else None
        lang_dir = target / LANGUAGES_DIR / lang
    log(
        f"added {lang} to {target}: {result.report['parameters_added']:,} parameters, "
        f"{result.report['minutes']:.2f} min"
    )
    return AddLanguageResult(target, lang, lang_dir, graph, result.report)
