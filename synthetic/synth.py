"""Generator of the synthetic multilingual product catalogue the demo model trains on.

Every item is a pure function of (seed, split, index): its attribute combination, the attribute subset
each caption mentions, the phrasings and the image jitter all come from hash-derived seeds, so the
output is byte-identical for a seed whatever the order or the number of worker processes.

The 23,040 combinations are shuffled once: test takes the first n_test, val the next n_val, and train
cycles through the rest, so no val/test combination is ever seen in training.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from synthetic.attributes import (
    ATTRIBUTE_NAMES,
    FULL_MENTION,
    N_COMBINATIONS,
    VOCABULARY,
    ProductAttributes,
    all_combinations,
)
from synthetic.lexicons import LANGUAGES, LEXICONS
from synthetic.render import render_image
from synthetic.shop_titles import SHOP_LANGUAGES, shop_title

SPLITS: tuple[str, ...] = ("train", "val", "test")
FORMAT_VERSION = 1

# Training captions drop some attributes so short shopping queries ("red mug") look like training text.
_P_DROP_PLACEMENT = 0.35
_P_DROP_BACKGROUND = 0.35
_P_DROP_PLAIN_PATTERN = 0.3
_P_DROP_SINGLE_COUNT = 0.2

_CHUNK = 256  # images per worker task
_PARALLEL_MIN_IMAGES = 1024  # below this, starting worker processes costs more than it saves


@dataclass(frozen=True)
class SynthConfig:
    seed: int = 0
    n_train: int = 20000
    n_val: int = 500
    n_test: int = 1000
    image_size: int = 96
    captions_per_language: int = 2  # aligned phrasings per image
    languages: tuple[str, ...] = LANGUAGES
    # A shop-style title per product in this language (``synthetic.shop_titles``), searched by hybrid
    # search; None: no title (the catalogue as before).
    shop_titles: str | None = None

    def __post_init__(self) -> None:
        for name in ("n_train", "n_val", "n_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.n_test + self.n_val > N_COMBINATIONS:
            raise ValueError(
                f"n_test + n_val = {self.n_test + self.n_val} exceeds the {N_COMBINATIONS} distinct "
                "attribute combinations; val and test items must all be distinct"
            )
        if self.n_train > 0 and self.n_test + self.n_val == N_COMBINATIONS:
            raise ValueError("val and test use every combination, none is left for training")
        if self.image_size < 16:
            raise ValueError(f"image_size must be >= 16, got {self.image_size}")
        if self.captions_per_language < 1:
            raise ValueError("captions_per_language must be >= 1")
        if self.shop_titles is not None and self.shop_titles not in SHOP_LANGUAGES:
            raise ValueError(f"shop titles exist in {', '.join(SHOP_LANGUAGES)}, not {self.shop_titles!r}")
        unknown = [lang for lang in self.languages if lang not in LEXICONS]
        if unknown or not self.languages or len(set(self.languages)) != len(self.languages):
            raise ValueError(f"languages must be distinct codes among {list(LEXICONS)}, got {self.languages}")

    def split_size(self, split: str) -> int:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}[_check_split(split)]


@dataclass(frozen=True)
class CatalogueItem:
    """One image and its aligned captions; captions[lang][j] mentions exactly mentions[j]."""

    id: str
    split: str
    index: int
    attributes: ProductAttributes
    captions: dict[str, tuple[str, ...]]
    mentions: tuple[frozenset[str], ...]
    phrasings: tuple[int, ...]
    image_seed: int

    @property
    def image_path(self) -> str:
        """Image path relative to the jsonl's folder."""
        return f"images/{self.split}/{self.id}.png"

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "image": self.image_path,
            "captions": {lang: list(texts) for lang, texts in self.captions.items()},
            "attributes": self.attributes.as_dict(),
        }


@dataclass(frozen=True)
class CatalogueSummary:
    out_dir: Path
    splits: dict[str, Path]  # split -> jsonl path
    counts: dict[str, int]  # split -> number of images
    catalogue_json: Path
    images_dir: Path
    seconds: float = field(compare=False)


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return split


def derive_seed(seed: int, *parts: str | int) -> int:
    """A 63-bit seed from the root seed and a path of names, independent of generation order."""
    text = "/".join(str(part) for part in (seed, *parts))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _combination_order(seed: int) -> np.ndarray:
    return np.random.default_rng(derive_seed(seed, "combinations")).permutation(N_COMBINATIONS)


def split_combinations(split: str, config: SynthConfig) -> list[ProductAttributes]:
    """The attribute combination of every item of a split, in item order."""
    combos = all_combinations()
    order = _combination_order(config.seed)
    n_held_out = config.n_test + config.n_val
    if _check_split(split) == "test":
        picked = order[: config.n_test]
    elif split == "val":
        picked = order[config.n_test : n_held_out]
    else:
        pool = order[n_held_out:]
        picked = pool[np.arange(config.n_train) % len(pool)] if config.n_train else pool[:0]
    return [combos[i] for i in picked]


def _training_mention(attrs: ProductAttributes, rng: np.random.Generator) -> frozenset[str]:
    mention = set(FULL_MENTION)
    if rng.random() < _P_DROP_PLACEMENT:
        mention.discard("placement")
    if rng.random() < _P_DROP_BACKGROUND:
        mention.discard("background")
    if attrs.pattern == "plain" and rng.random() < _P_DROP_PLAIN_PATTERN:
        mention.discard("pattern")
    if attrs.count == 1 and rng.random() < _P_DROP_SINGLE_COUNT:
        mention.discard("count")
    return frozenset(mention)


def _caption_plan(
    split: str, attrs: ProductAttributes, rng: np.random.Generator, config: SynthConfig
) -> tuple[tuple[frozenset[str], ...], tuple[int, ...]]:
    """Per caption slot j: the mentioned attributes and the phrasing index, shared by all languages.

    Phrasings are a random permutation so an image's captions differ in phrasing while slots last.
    """
    n_phrasings = max(LEXICONS[lang].N_PHRASINGS for lang in config.languages)
    order = rng.permutation(n_phrasings)
    phrasings = tuple(int(order[j % n_phrasings]) for j in range(config.captions_per_language))
    if split == "train":
        mentions = tuple(_training_mention(attrs, rng) for _ in range(config.captions_per_language))
    else:
        mentions = (FULL_MENTION,) * config.captions_per_language
    return mentions, phrasings


def iter_items(split: str, config: SynthConfig) -> Iterator[CatalogueItem]:
    """The items of a split, deterministic and without I/O."""
    for index, attrs in enumerate(split_combinations(split, config)):
        rng = np.random.default_rng(derive_seed(config.seed, split, index, "captions"))
        mentions, phrasings = _caption_plan(split, attrs, rng, config)
        captions = {
            lang: tuple(
                LEXICONS[lang].describe(attrs, phrasing % LEXICONS[lang].N_PHRASINGS, mention)
                for mention, phrasing in zip(mentions, phrasings, strict=True)
            )
            for lang in config.languages
        }
        yield CatalogueItem(
            id=f"{split}-{index:06d}",
            split=split,
            index=index,
            attributes=attrs,
            captions=captions,
            mentions=mentions,
            phrasings=phrasings,
            image_seed=derive_seed(config.seed, split, index, "image"),
        )


# (relative image path, attributes, image seed)
_RenderTask = tuple[str, ProductAttributes, int]


def _render_chunk(root: Path, image_size: int, tasks: Sequence[_RenderTask]) -> int:
    """Render and save a chunk of images under `root`; runs in worker processes."""
    for relpath, attrs, seed in tasks:
        image = render_image(attrs, image_size, np.random.default_rng(seed))
        image.save(root / relpath, format="PNG", compress_level=6)
    return len(tasks)


def _render_all(
    root: Path,
    config: SynthConfig,
    tasks: list[_RenderTask],
    progress: Callable[[int, int], None] | None,
    workers: int,
) -> None:
    chunks = [tasks[i : i + _CHUNK] for i in range(0, len(tasks), _CHUNK)]
    done = 0
    if progress:
        progress(0, len(tasks))
    if workers <= 1 or len(tasks) < _PARALLEL_MIN_IMAGES:
        for chunk in chunks:
            done += _render_chunk(root, config.image_size, chunk)
            if progress:
                progress(done, len(tasks))
        return
    # spawn, not fork: the caller (a trainer) may hold threads or CUDA state that fork would copy.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(_render_chunk, root, config.image_size, chunk) for chunk in chunks]
        for future in as_completed(futures):
            done += future.result()
            if progress:
                progress(done, len(tasks))


def _catalogue_json(config: SynthConfig, counts: dict[str, int]) -> dict[str, object]:
    settings = {**asdict(config), "languages": list(config.languages)}
    if config.shop_titles is None:  # written only when asked: catalogues without titles stay as they were
        del settings["shop_titles"]
    return {
        "format_version": FORMAT_VERSION,
        "config": settings,
        "counts": counts,
        "splits": {split: f"{split}.jsonl" for split in SPLITS},
        "images": "images",
        "n_combinations": N_COMBINATIONS,
        "vocabulary": {name: list(VOCABULARY[name]) for name in ATTRIBUTE_NAMES},
    }


def _write_text(path: Path, text: str) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)


def _move_into_place(tmp: Path, out_dir: Path, relpaths: Sequence[str]) -> None:
    for relpath in relpaths:
        target = out_dir / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / relpath, target)


def generate_catalogue(
    out_dir: Path,
    config: SynthConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
) -> CatalogueSummary:
    """Write {train,val,test}.jsonl, images/{split}/{id}.png and catalogue.json under `out_dir`.

    Everything is first written to a temporary folder inside `out_dir`, then moved into place file by
    file (catalogue.json last), so an interrupted run leaves earlier files intact; other files in
    `out_dir` are left alone. `workers` defaults to the CPU count.
    """
    config = config or SynthConfig()
    start = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out_dir))
    try:
        counts: dict[str, int] = {}
        tasks: list[_RenderTask] = []
        for split in SPLITS:
            (tmp / "images" / split).mkdir(parents=True)
            lines = []
            for item in iter_items(split, config):
                record = item.to_json()
                if config.shop_titles:
                    record["title"] = shop_title(item.attributes, config.shop_titles)
                lines.append(json.dumps(record, ensure_ascii=False) + "\n")
                tasks.append((item.image_path, item.attributes, item.image_seed))
            _write_text(tmp / f"{split}.jsonl", "".join(lines))
            counts[split] = len(lines)
        _render_all(tmp, config, tasks, progress, workers or os.cpu_count() or 1)
        text = json.dumps(_catalogue_json(config, counts), ensure_ascii=False, indent=2) + "\n"
        _write_text(tmp / "catalogue.json", text)
        _move_into_place(tmp, out_dir, [relpath for relpath, _, _ in tasks])
        _move_into_place(tmp, out_dir, [f"{split}.jsonl" for split in SPLITS] + ["catalogue.json"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return CatalogueSummary(
        out_dir=out_dir,
        splits={split: out_dir / f"{split}.jsonl" for split in SPLITS},
        counts=counts,
        catalogue_json=out_dir / "catalogue.json",
        images_dir=out_dir / "images",
        seconds=time.perf_counter() - start,
    )
