"""Parallel sentences without images, for MURAL's translation-pair (text-text) contrastive term."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from model.tokenization import tokenize
from synthetic.catalogue import CatalogueRecord


class ParallelCorpusError(ValueError):
    """A parallel corpus file is missing or malformed."""


@dataclass
class ParallelCorpus:
    """Aligned (source, target) sentence pairs."""

    pairs: list[tuple[str, str]]

    @classmethod
    def load(cls, path: Path) -> ParallelCorpus:
        """Read a TSV (``source<TAB>target``) or a jsonl of ``{"source": ..., "target": ...}``."""
        path = Path(path)
        if not path.is_file():
            raise ParallelCorpusError(f"parallel corpus not found: {path}")
        pairs: list[tuple[str, str]] = []
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                if path.suffix == ".jsonl":
                    try:
                        row = json.loads(line)
                        pairs.append((str(row["source"]), str(row["target"])))
                    except (json.JSONDecodeError, KeyError, TypeError) as exc:
                        raise ParallelCorpusError(
                            f"{path}:{number}: expected {{source, target}}: {exc}"
                        ) from exc
                else:
                    fields = line.split("\t")
                    if len(fields) != 2:
                        raise ParallelCorpusError(
                            f"{path}:{number}: expected 2 tab-separated fields, got {len(fields)}"
                        )
                    pairs.append((fields[0], fields[1]))
        if len(pairs) < 2:
            raise ParallelCorpusError(f"{path} needs at least 2 sentence pairs")
        return cls(pairs)

    def batch(
        self, tokenizer: PreTrainedTokenizerBase, size: int, max_length: int, rng: random.Random
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        chosen = rng.sample(self.pairs, min(size, len(self.pairs)))
        sources = tokenize(tokenizer, [s for s, _ in chosen], max_length)
        targets = tokenize(tokenizer, [t for _, t in chosen], max_length)
        return sources, targets


def pairs_from_catalogue(
    records: Sequence[CatalogueRecord],
    pairs_per_record: int,
    seed: int,
    source: str | None = None,
    target: str | None = None,
) -> list[tuple[str, str]]:
    """Translation pairs drawn from a catalogue: the captions of one image in two languages, same phrasing
    slot (slots are aligned across languages, so they say the same thing). Languages are drawn at random
    per pair (seeded), so every language meets every other.

    With ``source`` and ``target`` (e.g. a native language and a new one, for ``ccrk model add-language``)
    every pair is (source caption, target caption): the first ``pairs_per_record`` aligned slots of each
    record that has both languages."""
    if (source is None) != (target is None):
        raise ValueError("give both source and target languages, or neither")
    rng = random.Random(seed)
    pairs: list[tuple[str, str]] = []
    for record in records:
        if source is not None and target is not None:
            if record.captions.get(source) and record.captions.get(target):
                slots = min(len(record.captions[source]), len(record.captions[target]), pairs_per_record)
                pairs.extend((record.captions[source][j], record.captions[target][j]) for j in range(slots))
            continue
        langs = sorted(record.captions)
        if len(langs) < 2:
            continue
        for _ in range(pairs_per_record):
            a, b = rng.sample(langs, 2)
            slots = min(len(record.captions[a]), len(record.captions[b]))
            j = rng.randrange(slots)
            pairs.append((record.captions[a][j], record.captions[b][j]))
    return pairs


def write_pairs_tsv(pairs: Sequence[tuple[str, str]], path: Path) -> None:
    """Write pairs as ``source<TAB>target`` lines (whitespace runs, tabs included, become one space)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for source, target in pairs:
            handle.write(" ".join(source.split()) + "\t" + " ".join(target.split()) + "\n")
    tmp.replace(path)
