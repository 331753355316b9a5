"""In-memory image/caption datasets and K-language batches for training and evaluation."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from model.preprocessing import ImagePreprocessor
from model.tokenization import tokenize
from synthetic.catalogue import CatalogueRecord, load_split


@dataclass
class CaptionedImages:
    """A split held in memory: uint8 pixels and per-language caption lists.

    Attributes:
        ids: catalogue ids, one per image.
        pixels: (N, 3, S, S) uint8.
        captions: per image, language -> list of captions (aligned phrasings).
        languages: the languages used, in column order of every rank table.
        item_keys: per image, a key equal for images showing the same product (their attribute set), so a
            duplicate is never used as a negative; the id when attributes are unknown.
    """

    ids: list[str]
    pixels: torch.Tensor
    captions: list[dict[str, list[str]]]
    languages: tuple[str, ...]
    item_keys: list[str]

    def __len__(self) -> int:
        return len(self.ids)


def _item_key(record: CatalogueRecord) -> str:
    if record.attributes:
        return json.dumps(record.attributes, sort_keys=True, ensure_ascii=False)
    return record.id


def load_captioned_images(
    path: Path,
    preprocessor: ImagePreprocessor,
    languages: Sequence[str] | None = None,
    limit: int | None = None,
    threads: int = 2,
) -> CaptionedImages:
    """Read a catalogue split (reference jsonl format) and decode its images.

    ``languages`` defaults to those every record has; a requested language a record lacks is an error
    naming the record, since rank tables need every language for every instance.
    """
    records = load_split(path)[:limit]
    if not records:
        raise ValueError(f"{path} holds no records")
    if languages is None:
        common = set(records[0].captions)
        for record in records[1:]:
            common &= set(record.captions)
        order = list(records[0].captions)
        languages = tuple(lang for lang in order if lang in common)
    for record in records:
        missing = [lang for lang in languages if not record.captions.get(lang)]
        if missing:
            raise ValueError(f"{path}: record {record.id!r} has no caption in {missing}")
    pixels = torch.from_numpy(preprocessor.load_many_uint8([r.image for r in records], threads=threads))
    return CaptionedImages(
        ids=[r.id for r in records],
        pixels=pixels,
        captions=[{lang: list(r.captions[lang]) for lang in languages} for r in records],
        languages=tuple(languages),
        item_keys=[_item_key(r) for r in records],
    )


@dataclass
class TrainBatch:
    """B images with one caption in each of K languages.

    Attributes:
        pixel_values: (B, 3, S, S) normalised.
        input_ids, attention_mask: (B * K, L) captions, image-major (row b * K + k is image b, language k).
        text_mask: (B, K) True where the caption exists.
        same_item: (B, B) True where two images show the same product.
    """

    pixel_values: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    text_mask: torch.Tensor
    same_item: torch.Tensor

    def to(self, device: torch.device) -> TrainBatch:
        return TrainBatch(*(t.to(device, non_blocking=True) for t in vars(self).values()))


def epoch_batches(n: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The shuffled index batches of one epoch; a pure function of (seed, epoch) so a resumed run replays
    exactly the batches it had not yet seen. The last incomplete batch is dropped (contrastive losses
    want full batches)."""
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    usable = len(order) - len(order) % batch_size if len(order) >= batch_size else len(order)
    return [order[i : i + batch_size] for i in range(0, usable, batch_size)]


def make_batch(
    data: CaptionedImages,
    indices: Sequence[int],
    tokenizer: PreTrainedTokenizerBase,
    preprocessor: ImagePreprocessor,
    max_length: int,
    rng: random.Random,
) -> TrainBatch:
    """One caption per language per image, its phrasing drawn at random."""
    texts: list[str] = []
    for i in indices:
        for lang in data.languages:
            texts.append(rng.choice(data.captions[i][lang]))
    tokens = tokenize(tokenizer, texts, max_length)
    keys = [data.item_keys[i] for i in indices]
    same = torch.tensor([[a == b for b in keys] for a in keys], dtype=torch.bool)
    same.fill_diagonal_(False)
    return TrainBatch(
        pixel_values=preprocessor.normalize(data.pixels[list(indices)]),
        input_ids=tokens["input_ids"],
        attention_mask=tokens["attention_mask"],
        text_mask=torch.ones(len(indices), len(data.languages), dtype=torch.bool),
        same_item=same,
    )


def iter_caption_corpus(data: CaptionedImages) -> Iterator[str]:
    """Every caption of a split, for training the demo tokenizer."""
    for captions in data.captions:
        for texts in captions.values():
            yield from texts
