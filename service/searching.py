"""The search pipeline: language -> cache -> encode -> ANN (filtered) -> re-rank -> page -> metadata ->
match labels.

A little over 400 lines: text, image and consistency searches share one class's leased index, caches and
ranking steps, each a short method (match quality lives in ``service.matching``, language in
``service.language``).

Everything here is blocking (ONNX Runtime, faiss, sqlite, Redis) and runs in a worker thread: the routes
call it through ``anyio.to_thread.run_sync`` so the event loop only parses and answers HTTP.
"""

from __future__ import annotations

import hashlib
import json
import time
import unicodedata
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np

from model.reranking import MATCH_OUTPUT, RerankScore, rerank_scores
from model.runtime import EncodedTexts, Encoder, EncoderError
from service.cache import EMBEDDING, RESULT, Cache, pack_texts, unpack_texts
from service.errors import InvalidInputError
from service.index_holder import Served
from service.language import LanguageDetector
from service.matching import MatchJudge
from service.metrics import Metrics
from service.schemas import (
    ImageSearchResponse,
    LanguageInfo,
    MatchThresholdsInfo,
    SearchHit,
    SearchRequest,
    SearchResponse,
    Timings,
)
from service.uploads import decode_upload


def image_url(item_id: str) -> str:
    """Where a result's image is served: ``/v1/images/{id}``, or ``/v1/images?id=...`` for an id with a line
    break (a URL path cannot match one: it got a link that answered 404)."""
    if "\n" in item_id or "\r" in item_id:
        return f"/v1/images?id={quote(item_id, safe='')}"
    return f"/v1/images/{quote(item_id, safe='')}"


def normalise_query(text: str) -> str:
    """NFKC and collapsed whitespace: the text that is encoded and the cache key (case is kept: the
    tokenizer is case-sensitive)."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def _digest(payload: object) -> str:
    data = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


@dataclass
class Ranked:
    """A result page before metadata: rows with their scores, and the timings of how it was made."""

    rows: np.ndarray
    scores: np.ndarray
    rerank_scores: np.ndarray | None
    first_rank: int
    reranked: bool
    top_score: float | None = None  # the best dual score among all candidates (the query's match quality)


class Searcher:
    def __init__(
        self,
        *,
        encoder: Encoder,
        model_name: str,
        model_fingerprint: str,
        detector: LanguageDetector,
        cache: Cache,
        metrics: Metrics,
        default_rerank: bool,
        default_rerank_k: int,
        max_upload_bytes: int,
        rerank_score: RerankScore = "dual_plus_margin",
        max_query_pixels: int = 24_000_000,
    ) -> None:
        self.encoder = encoder
        self.model_name = model_name
        self.model_fingerprint = model_fingerprint
        self.detector = detector
        self.cache = cache
        self.metrics = metrics
        # A model without a fusion encoder cannot re-rank: its default is off, and asking is refused.
        self.can_rerank = encoder.capabilities.rerank
        needed = MATCH_OUTPUT[rerank_score]
        if self.can_rerank and needed not in encoder.capabilities.fusion_outputs:
            raise EncoderError(
                f"re-rank score {rerank_score!r} needs the fusion output {needed!r}, which this model's "
                "export lacks; re-run `ccrk export onnx` or keep the default score"
            )
        self.default_rerank = default_rerank and self.can_rerank
        self.default_rerank_k = default_rerank_k
        self.rerank_score = rerank_score
        self.max_upload_bytes = max_upload_bytes
        self.max_query_pixels = max_query_pixels
        self.judge = MatchJudge(encoder)

    # -- pieces ---------------------------------------------------------------------------------------------

    def resolve_rerank(self, requested: bool | None) -> bool:
        """Whether to re-rank: the request's choice, else the server default; refused (422 naming the
        ``rerank`` field) when the model has no fusion encoder, rather than silently not re-ranking."""
        if requested is None:
            return self.default_rerank
        if requested and not self.can_rerank:
            raise InvalidInputError(
                f"the model {self.model_name} has no fusion encoder, so it cannot re-rank; "
                "send rerank false or leave it out",
                loc=("body", "rerank"),
            )
        return requested

    def encode_query(self, text: str) -> EncodedTexts:
        """The query's embedding (and text states for re-ranking), from the cache when there."""
        if not self.cache.enabled:
            return self.encoder.encode_text([text]).row(0)
        key = f"{self.model_fingerprint[:16]}:{_digest(text)}"
        cached = self.cache.get(EMBEDDING, key)
        if cached is not None:
            try:
                return unpack_texts(cached)
            except (ValueError, OSError, EOFError):
                pass  # a foreign or truncated entry: encode again and overwrite it
        encoded = self.encoder.encode_text([text]).row(0)
        self.cache.set(EMBEDDING, key, pack_texts(encoded))
        return encoded

    def allowed_rows(self, served: Served, filters: dict[str, Any] | None) -> np.ndarray | None:
        if not filters:
            return None
        known = served.index.fields
        for name in filters:
            if name not in known:
                raise InvalidInputError(
                    f"unknown filter field {name!r}; known fields: {', '.join(sorted(known)) or 'none'}",
                    loc=("body", "filters", name),
                )
        plain = {
            name: value.model_dump(exclude_none=True) if hasattr(value, "model_dump") else value
            for name, value in filters.items()
        }
        return served.index.filter_rows(plain)

    def rank(
        self,
        served: Served,
        query: EncodedTexts,
        *,
        top_k: int,
        offset: int,
        rerank: bool,
        rerank_k: int,
        allowed: np.ndarray | None,
        timings: dict[str, float],
    ) -> Ranked:
        index = served.index
        want = offset + top_k
        n_candidates = max(want, rerank_k) if rerank else want
        n_candidates = max(1, min(n_candidates, len(index)))
        start = time.perf_counter()
        scores, rows = index.search(query.embeds, n_candidates, allowed)
        timings["search"] = time.perf_counter() - start
        self.metrics.stage_seconds.labels("search").observe(timings["search"])
        scores, rows = scores[0], rows[0]
        keep = rows >= 0
        scores, rows = scores[keep], rows[keep]
        top_score = float(scores.max()) if scores.size else None
        combined_page: np.ndarray | None = None
        if rerank and rows.size:
            start = time.perf_counter()
            head = min(rerank_k, rows.size)
            tokens = index.rerank_tokens(rows[:head])
            output = MATCH_OUTPUT[self.rerank_score]
            match = self.encoder.score_pairs(query, tokens, output).astype(np.float32)
            # By default the project's score: dual logit (similarity / temperature) + match log-odds.
            combined = rerank_scores(scores[:head], match, self.encoder.temperature, self.rerank_score)
            combined = combined.astype(np.float32)
            order = np.argsort(-combined, kind="stable")  # ties keep the dual encoder's order
            rows = np.concatenate([rows[:head][order], rows[head:]])
            scores = np.concatenate([scores[:head][order], scores[head:]])
            combined_page = np.concatenate([combined[order], np.full(rows.size - head, np.nan, np.float32)])
            timings["rerank"] = time.perf_counter() - start
            self.metrics.stage_seconds.labels("rerank").observe(timings["rerank"])
            self.metrics.rerank_candidates.observe(head)
        self.metrics.rerank.labels("yes" if combined_page is not None else "no").inc()
        page = slice(offset, offset + top_k)
        return Ranked(
            rows=rows[page],
            scores=scores[page],
            rerank_scores=None if combined_page is None else combined_page[page],
            first_rank=offset,
            reranked=combined_page is not None,
            top_score=top_score,
        )

    def hits(self, served: Served, ranked: Ranked) -> list[SearchHit]:
        items = served.items(ranked.rows.tolist())
        hits = []
        for n, item in enumerate(items):
            item_id = item.pop("id")
            item.pop("path", None)  # a server path; clients fetch the image through image_url
            rerank_score = None
            if ranked.rerank_scores is not None and not np.isnan(ranked.rerank_scores[n]):
                rerank_score = float(ranked.rerank_scores[n])
            hits.append(
                SearchHit(
                    id=item_id,
                    score=float(ranked.scores[n]),
                    rerank_score=rerank_score,
                    rank=ranked.first_rank + n,
                    metadata=item,
                    image_url=image_url(item_id),
                )
            )
        return hits

    # -- endpoints ------------------------------------------------------------------------------------------

    def search(self, served: Served, request: SearchRequest) -> SearchResponse:
        start = time.perf_counter()
        text = normalise_query(request.query)
        if not text:
            raise InvalidInputError("query is empty after whitespace normalisation", loc=("body", "query"))
        language = self.detector.resolve(text, request.lang)
        rerank = self.resolve_rerank(request.rerank)
        filters = (
            {
                k: v.model_dump(exclude_none=True) if hasattr(v, "model_dump") else v
                for k, v in request.filters.items()
            }
            if request.filters
            else None
        )
        result_key = (
            _digest(
                [
                    served.version,
                    text,
                    request.top_k,
                    request.offset,
                    rerank,
                    request.rerank_k if rerank else 0,
                    self.rerank_score if rerank else None,  # another score orders the shortlist otherwise
                    filters,
                    language.code,  # match labels are calibrated per language
                    request.min_score,
                ]
            )
            if self.cache.enabled
            else None
        )
        cached = self.cache.get(RESULT, result_key) if result_key is not None else None
        if cached is not None:
            try:
                payload = json.loads(cached)
                return SearchResponse(
                    results=[SearchHit(**hit) for hit in payload["results"]],
                    language=language,
                    index_version=served.version,
                    model=self.model_name,
                    reranked=payload["reranked"],
                    timings_ms=Timings(
                        encode=0.0, search=0.0, rerank=0.0, total=_ms(time.perf_counter() - start)
                    ),
                    cached=True,
                    match=payload["match"],
                    match_thresholds=payload["match_thresholds"],
                )
            except (ValueError, KeyError, TypeError):
                pass  # unreadable entry: compute afresh
        allowed = self.allowed_rows(served, request.filters)
        timings = {"encode": 0.0, "search": 0.0, "rerank": 0.0}
        t0 = time.perf_counter()
        query = self.encode_query(text)
        timings["encode"] = time.perf_counter() - t0
        self.metrics.stage_seconds.labels("encode").observe(timings["encode"])
        ranked = self.rank(
            served,
            query,
            top_k=request.top_k,
            offset=request.offset,
            rerank=rerank,
            rerank_k=request.rerank_k,
            allowed=allowed,
            timings=timings,
        )
        judged = self.judge.judge(
            served,
            language.code if language.supported else None,
            self.hits(served, ranked),
            ranked.top_score,
            request.min_score,
        )
        hits, thresholds = judged.hits, MatchThresholdsInfo(**vars(judged.thresholds))
        if result_key is not None:
            payload = {
                "results": [h.model_dump() for h in hits],
                "reranked": ranked.reranked,
                "match": judged.label,
                "match_thresholds": thresholds.model_dump(),
            }
            self.cache.set(RESULT, result_key, json.dumps(payload).encode())
        return SearchResponse(
            match=judged.label,
            match_thresholds=thresholds,
            results=hits,
            language=language,
            index_version=served.version,
            model=self.model_name,
            reranked=ranked.reranked,
            timings_ms=Timings(
                encode=_ms(timings["encode"]),
                search=_ms(timings["search"]),
                rerank=_ms(timings["rerank"]),
                total=_ms(time.perf_counter() - start),
            ),
            cached=False,
        )

    def ranked_ids(
        self, served: Served, text: str, top_k: int, rerank: bool, filters: dict[str, Any] | None
    ) -> list[str]:
        """Result ids of one query (consistency report)."""
        query = self.encode_query(text)
        allowed = self.allowed_rows(served, filters)
        ranked = self.rank(
            served,
            query,
            top_k=top_k,
            offset=0,
            rerank=rerank,
            rerank_k=max(top_k, self.default_rerank_k),
            allowed=allowed,
            timings={},
        )
        return [item["id"] for item in served.items(ranked.rows.tolist())]

    def search_image(
        self,
        served: Served,
        data: bytes,
        content_type: str | None,
        top_k: int,
        offset: int,
        filters: dict[str, Any] | None,
    ) -> ImageSearchResponse:
        start = time.perf_counter()
        image = decode_upload(
            data,
            content_type,
            max_bytes=self.max_upload_bytes,
            max_pixels=self.max_query_pixels,
            image_size=self.encoder.config.vision.image_size,
        )
        allowed = self.allowed_rows(served, filters)
        timings = {"encode": 0.0, "search": 0.0, "rerank": 0.0}
        t0 = time.perf_counter()
        embeds = self.encoder.encode_images([image]).embeds
        timings["encode"] = time.perf_counter() - t0
        del image
        query = EncodedTexts(embeds, np.zeros((1, 0, 0), np.float32), np.zeros((1, 0), np.int64))
        ranked = self.rank(
            served,
            query,
            top_k=top_k,
            offset=offset,
            rerank=False,
            rerank_k=0,
            allowed=allowed,
            timings=timings,
        )
        return ImageSearchResponse(
            results=self.hits(served, ranked),
            index_version=served.version,
            model=self.model_name,
            timings_ms=Timings(
                encode=_ms(timings["encode"]),
                search=_ms(timings["search"]),
                rerank=0.0,
                total=_ms(time.perf_counter() - start),
            ),
        )

    def language_of(self, text: str, hint: str | None) -> LanguageInfo:
        return self.detector.resolve(normalise_query(text), hint)
