"""Products upserted through the change log since a served version: their rows after the version's own, with
what the version's channels hold of a product (photo and text embeddings, terms, re-rank tokens), kept in
memory by each process serving the version and searched exactly beside its indexes.

An upsert is embedded by the process applying it (``ProductEmbedder``: the service's encoder over the
photos the write stored, ``store.live.photos``), so every process serving the version holds the same rows
in the same order: the log orders them. Row ``base_rows + j`` is the ``j``-th product upserted; rows are
allotted in blocks of ``ROW_BLOCK`` (``capacity``), so the row space a search sizes its masks by changes
once per block, not per write; rows of the block not written yet are not live.

``DeltaRows`` grows (one per overlay, under its lock); ``Delta`` is one snapshot's view of it: a prefix of
arrays that are only ever appended to (the same trick as a log: what a snapshot sees never changes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from store.live.records import Upsert
from store.products.vectors import GroupedVectors

ROW_BLOCK = 4_096


@dataclass(frozen=True)
class TextValue:
    """One searched text value of an upserted product, analysed and embedded as a build does."""

    field: str  # the base field name (``title`` for ``title@de``)
    lang: str  # ``und`` when unknown
    text: str
    terms: tuple[str, ...]


@dataclass
class EmbeddedProduct:
    """What the version's channels would hold of one upserted product.

    Attributes:
        photo_embeds: (P, D) cross-modal embeddings of its photos, in order (P may be 0).
        photo_visual: (P, V) visual embeddings, or None where the model has none apart.
        tokens: (T, W) re-rank tokens of its first photo, or None (no photo, or no fusion encoder).
        photo_paths: where each photo lies (its location in the photo store).
        texts: its searched text values; ``text_embeds`` (len(texts), D) their embeddings.
    """

    photo_embeds: np.ndarray
    photo_visual: np.ndarray | None
    tokens: np.ndarray | None
    photo_paths: list[str]
    texts: list[TextValue]
    text_embeds: np.ndarray


class ProductEmbedder(Protocol):
    """Embeds an upserted product (the service's, over its encoder); raises on a photo it cannot read (the
    upsert is then counted as not applied, in every process alike)."""

    def embed(self, upsert: Upsert) -> EmbeddedProduct: ...


class _Growing:
    """An array appended to in place (doubling), read as prefixes."""

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.data = np.zeros((16, *shape), dtype)
        self.size = 0

    def append(self, block: np.ndarray) -> None:
        need = self.size + len(block)
        if need > len(self.data):
            grown = np.zeros((max(need, 2 * len(self.data)), *self.data.shape[1:]), self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown  # a snapshot holding the old buffer keeps reading its prefix of it
        self.data[self.size : need] = block
        self.size = need

    def view(self) -> np.ndarray:
        out = self.data[: self.size]
        out.setflags(write=False)
        return out


@dataclass(frozen=True)
class Delta:
    """One snapshot's upserted products (``count`` of them; row ``base_rows + j`` is the ``j``-th)."""

    base_rows: int
    count: int
    ids: Sequence[str]
    paths: Sequence[str]  # each product's first photo ('' without one)
    embeds: np.ndarray  # (count, D) first photo's cross-modal embedding (zeros without one)
    has_photo: np.ndarray  # (count,) bool
    tokens: np.ndarray | None  # (count, T, W) or None
    photos: GroupedVectors  # owners: local product numbers
    visual: GroupedVectors | None
    photo_paths: Sequence[str]  # by photo row
    texts: GroupedVectors
    text_values: Sequence[TextValue]  # by text row
    text_sum_norms: np.ndarray  # (count,) float32
    postings: Mapping[str, Sequence[tuple[int, int]]] = field(repr=False)  # term -> (text row, tf)
    text_lengths: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.int32))

    @property
    def capacity(self) -> int:
        """Rows allotted after the version's: whole blocks."""
        return -(-self.count // ROW_BLOCK) * ROW_BLOCK

    def local(self, row: int) -> int:
        return row - self.base_rows


class DeltaRows:
    """The upserted products of one overlay, in log order (not thread-safe: the overlay's lock)."""

    def __init__(self, base_rows: int, dim: int, visual_dim: int | None, tokens: tuple[int, int] | None):
        self.base_rows = base_rows
        self.dim = dim
        self.visual_dim = visual_dim
        self.ids: list[str] = []
        self.paths: list[str] = []
        self.embeds = _Growing((dim,), np.float32)
        self.has_photo = _Growing((), bool)
        self.tokens = None if tokens is None else _Growing(tokens, np.float32)
        self.photo_vectors = _Growing((dim,), np.float32)
        self.photo_visual = None if visual_dim is None else _Growing((visual_dim,), np.float32)
        self.photo_owners = _Growing((), np.int64)
        self.photo_paths: list[str] = []
        self.text_vectors = _Growing((dim,), np.float32)
        self.text_owners = _Growing((), np.int64)
        self.text_values: list[TextValue] = []
        self.text_lengths = _Growing((), np.int32)
        self.sum_norms = _Growing((), np.float32)
        self.postings: dict[str, list[tuple[int, int]]] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, item_id: str, product: EmbeddedProduct) -> int:
        """Append one product; its row."""
        local = len(self.ids)
        photos = np.asarray(product.photo_embeds, np.float32).reshape(-1, self.dim)
        self.ids.append(item_id)
        self.paths.append(product.photo_paths[0] if product.photo_paths else "")
        self.embeds.append(photos[:1] if len(photos) else np.zeros((1, self.dim), np.float32))
        self.has_photo.append(np.array([len(photos) > 0]))
        if self.tokens is not None:
            shape = self.tokens.data.shape[1:]
            first = product.tokens if product.tokens is not None else np.zeros(shape, np.float32)
            self.tokens.append(np.asarray(first, np.float32).reshape(1, *shape))
        self.photo_vectors.append(photos)
        if self.photo_visual is not None:
            visual = product.photo_visual if product.photo_visual is not None else photos
            self.photo_visual.append(np.asarray(visual, np.float32).reshape(len(photos), -1))
        self.photo_owners.append(np.full(len(photos), local, np.int64))
        self.photo_paths.extend(product.photo_paths[: len(photos)])
        texts = np.asarray(product.text_embeds, np.float32).reshape(-1, self.dim)
        first_text = self.text_owners.size
        self.text_vectors.append(texts)
        self.text_owners.append(np.full(len(texts), local, np.int64))
        self.text_values.extend(product.texts)
        self.text_lengths.append(np.array([len(v.terms) for v in product.texts], np.int32))
        total = texts.sum(axis=0)
        self.sum_norms.append(np.array([np.sqrt(np.dot(total, total))], np.float32))
        for offset, value in enumerate(product.texts):
            counts: dict[str, int] = {}
            for term in value.terms:
                counts[term] = counts.get(term, 0) + 1
            for term, tf in counts.items():
                self.postings.setdefault(term, []).append((first_text + offset, tf))
        return self.base_rows + local

    def delta(self) -> Delta:
        n = len(self.ids)
        photo_owners = self.photo_owners.view()
        text_owners = self.text_owners.view()
        visual = None
        if self.photo_visual is not None:
            visual = GroupedVectors(self.photo_visual.view(), photo_owners, None, n)
        return Delta(
            base_rows=self.base_rows,
            count=n,
            ids=self.ids,
            paths=self.paths,
            embeds=self.embeds.view(),
            has_photo=self.has_photo.view(),
            tokens=None if self.tokens is None else self.tokens.view(),
            photos=GroupedVectors(self.photo_vectors.view(), photo_owners, None, n),
            visual=visual,
            photo_paths=self.photo_paths,
            texts=GroupedVectors(self.text_vectors.view(), text_owners, None, n),
            text_values=self.text_values,
            text_sum_norms=self.sum_norms.view(),
            postings=self.postings,
            text_lengths=self.text_lengths.view(),
        )
