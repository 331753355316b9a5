"""Embedding an upserted product as a build embeds a catalogue's (``store.live.delta.ProductEmbedder``): its
photos, read from the index's photo store and decoded as query uploads are, through the image tower (every
photo's cross-modal and visual embedding, the first photo's re-rank tokens); its searched text values
identified (``title@de`` by its tag, an untagged one by the indexer's detector), embedded by the text tower
and analysed for BM25 (``indexer.products``: the same calls a build makes).

Every process serving the index embeds the upserts it applies, so none depends on another's memory; a
photo some process of the machine encoded already is read from the index's photo embedding cache
(``store.live.embed_cache``) instead of being encoded again.
"""

from __future__ import annotations

import threading

import numpy as np

from indexer.products import UNKNOWN, TextValue, catalogue_detector, encode_texts, identify_languages
from model.runtime import Encoder
from service.uploads import decode_upload
from store.live.delta import EmbeddedProduct
from store.live.delta import TextValue as DeltaText
from store.live.embed_cache import PhotoEmbedding, PhotoEmbeddingCache
from store.live.photos import PhotoStore
from store.live.records import Upsert
from store.text.language_id import LanguageDetector
from store.text.lexical import analyze

DECODE_LIMIT_BYTES = 1 << 30  # the write route checked each photo's size; the stored bytes are those


class CatalogueEmbedder:
    """Embeds upserts of one index with the service's encoder."""

    def __init__(
        self,
        encoder: Encoder,
        photos: PhotoStore,
        max_pixels: int,
        cache: PhotoEmbeddingCache | None = None,
        model_key: str = "",
    ) -> None:
        self.encoder = encoder
        self.photos = photos
        self.max_pixels = max_pixels
        self.cache = cache
        self.model_key = model_key  # names the encoder in the cache (model fingerprint, backend, precision)
        self._detector: LanguageDetector | None = None  # built at the first untagged value, then kept
        self._detector_lock = threading.Lock()

    def detector(self) -> LanguageDetector:
        """The language detector, built once (about 0.5 s; thread-safe once built)."""
        with self._detector_lock:
            if self._detector is None:
                self._detector = catalogue_detector(self.encoder.config.languages)
            return self._detector

    def _photos(self, upsert: Upsert) -> list[PhotoEmbedding]:
        """Each photo of ``upsert`` through the image tower, in order: from the cache where it holds one,
        else decoded and encoded (and kept there)."""
        digests = [ref.digest for ref in upsert.photos]
        cached = self.cache.get(self.model_key, digests) if self.cache is not None else {}
        missing = [ref for ref in upsert.photos if ref.digest not in cached]
        if missing:
            images = [
                decode_upload(
                    self.photos.read(ref),
                    None,
                    max_bytes=DECODE_LIMIT_BYTES,
                    max_pixels=self.max_pixels,
                    image_size=self.encoder.config.vision.image_size,
                )
                for ref in missing
            ]
            encoded = self.encoder.encode_images(images)
            rerank = self.encoder.capabilities.rerank
            made = {
                ref.digest: PhotoEmbedding(
                    np.asarray(encoded.embeds[i], np.float32),
                    None if encoded.visual is None else np.asarray(encoded.visual[i], np.float32),
                    np.asarray(encoded.tokens[i], np.float32) if rerank else None,
                )
                for i, ref in enumerate(missing)
            }
            if self.cache is not None:
                self.cache.put(self.model_key, made)
            cached = {**cached, **made}
        return [cached[d] for d in digests]

    def embed(self, upsert: Upsert) -> EmbeddedProduct:
        dim = self.encoder.config.embed_dim
        photos = self._photos(upsert)
        if photos:
            embeds = np.stack([p.embeds for p in photos])
            visual = None if any(p.visual is None for p in photos) else np.stack([p.visual for p in photos])
            tokens = photos[0].tokens
        else:
            embeds, visual, tokens = np.zeros((0, dim), np.float32), None, None
        values = []
        for key, text in upsert.text.items():
            base, _, tag = key.partition("@")
            clean = " ".join(text.split())
            if clean:
                values.append(TextValue(0, base, tag.lower() or None, clean))
        if any(v.lang is None for v in values):
            identify_languages(values, self.encoder.config.languages, self.detector())
        for value in values:
            value.lang = value.lang or UNKNOWN
        text_embeds = encode_texts(self.encoder, values) if values else np.zeros((0, dim), np.float32)
        texts = [DeltaText(v.field, str(v.lang), v.text, tuple(analyze(v.text, v.lang))) for v in values]
        return EmbeddedProduct(
            photo_embeds=np.asarray(embeds, np.float32),
            photo_visual=None if visual is None else np.asarray(visual, np.float32),
            tokens=None if tokens is None else np.asarray(tokens, np.float32),
            photo_paths=[str(self.photos.path_of(ref)) for ref in upsert.photos],  # served from there
            texts=texts,
            text_embeds=np.asarray(text_embeds, np.float32),
        )
