"""The search pipelines, each a method run on one leased version: text (language -> result cache -> encode
-> ANN, filtered -> re-rank -> page -> metadata -> match labels), image (decode -> encode -> ANN, filtered
-> page -> metadata) and consistency (one intent in several languages, compared).

Everything here is blocking (ONNX Runtime, faiss, sqlite, Redis) and runs in a worker thread
(``service.search.facade``). It records no metrics: each method returns what it did with its answer, and
the facade hands that to the telemetry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from model.reranking import RerankScore
from model.runtime import Encoder
from monitoring.consistency import consistency_report
from service.cache import RESULT, Cache
from service.errors import InvalidInputError
from service.index_holder import Served
from service.language import LanguageDetector
from service.matching import MatchJudge
from service.schemas import (
    ConsistencyRequest,
    ConsistencyResponse,
    ImageSearchResponse,
    LanguageInfo,
    LanguageResults,
    MatchThresholdsInfo,
    SearchRequest,
    SearchResponse,
)
from service.search.filters import SearchFilters, allowed_rows
from service.search.query import digest, normalise_query
from service.search.ranking import Ranked, Ranker
from service.search.responses import ResponseBuilder, since_ms
from service.uploads import decode_upload


@dataclass
class TextOutcome:
    response: SearchResponse
    ranked: Ranked | None  # None for an answer from the result cache (nothing encoded or ranked)
    encode_s: float = 0.0


@dataclass
class ImageOutcome:
    response: ImageSearchResponse
    ranked: Ranked


@dataclass
class ConsistencyOutcome:
    response: ConsistencyResponse
    ranked: list[Ranked]  # one per language


class SearchPipeline:
    """Thread-safe; one per process, made once the model is loaded."""

    def __init__(
        self,
        *,
        encoder: Encoder,
        model_name: str,
        model_fingerprint: str,
        detector: LanguageDetector,
        cache: Cache,
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
        self.ranker = Ranker(encoder, cache, model_fingerprint=model_fingerprint, rerank_score=rerank_score)
        self.responses = ResponseBuilder(model_name)
        self.judge = MatchJudge(encoder)
        # A model without a fusion encoder cannot re-rank: its default is off, and asking is refused.
        self.can_rerank = encoder.capabilities.rerank
        self.default_rerank = default_rerank and self.can_rerank
        self.default_rerank_k = default_rerank_k
        self.rerank_score = rerank_score
        self.max_upload_bytes = max_upload_bytes
        self.max_query_pixels = max_query_pixels

    def resolve_rerank(self, requested: bool | None, lang: str | None = None) -> bool:
        """Whether to re-rank: the request's choice, else the server default, except for a language the model
        acquired (``ccrk model add-language``): the frozen fusion encoder never saw an acquirer's states and
        re-ranking cost those languages 2-3 points of R@1 (bench/add_language.py), so they are not re-ranked
        unless a request asks. Refused (422 naming the ``rerank`` field) when the model has no fusion
        encoder, rather than silently not re-ranking."""
        if requested is None:
            return self.default_rerank and lang not in self.ranker.acquired
        if requested and not self.can_rerank:
            raise InvalidInputError(
                f"the model {self.model_name} has no fusion encoder, so it cannot re-rank; "
                "send rerank false or leave it out",
                loc=("body", "rerank"),
            )
        return requested

    # -- text ------------------------------------------------------------------------------------------------

    def text(self, served: Served, request: SearchRequest) -> TextOutcome:
        start = time.perf_counter()
        text = normalise_query(request.query)
        if not text:
            raise InvalidInputError("query is empty after whitespace normalisation", loc=("body", "query"))
        language = self.detector.resolve(text, request.lang)
        rerank = self.resolve_rerank(request.rerank, language.code)
        filters = SearchFilters.of(request.filters)
        result_key = self._result_key(served, request, text, rerank, filters, language)
        if result_key is not None:
            entry = self.cache.get(RESULT, result_key)
            if entry is not None:
                cached = self.responses.cached_text(served, entry, language=language, start=start)
                if cached is not None:  # else an unreadable entry: compute afresh
                    return TextOutcome(cached, ranked=None)
        allowed = allowed_rows(filters, served)
        t0 = time.perf_counter()
        query = self.ranker.encode_text(text, language.code)
        encode_s = time.perf_counter() - t0
        ranked = self.ranker.text(
            served,
            query,
            top_k=request.top_k,
            offset=request.offset,
            rerank=rerank,
            rerank_k=request.rerank_k,
            allowed=allowed,
        )
        judged = self.judge.judge(
            served,
            language.code if language.supported else None,
            self.responses.hits(served, ranked),
            ranked.top_score,
            request.min_score,
        )
        response = self.responses.text(
            served,
            hits=judged.hits,
            label=judged.label,
            thresholds=MatchThresholdsInfo(**vars(judged.thresholds)),
            language=language,
            ranked=ranked,
            encode_s=encode_s,
            start=start,
        )
        if result_key is not None:
            self.cache.set(RESULT, result_key, self.responses.cache_entry(response))
            response.timings_ms.total = since_ms(start)  # the total includes the cache write
        return TextOutcome(response, ranked=ranked, encode_s=encode_s)

    def _result_key(
        self,
        served: Served,
        request: SearchRequest,
        text: str,
        rerank: bool,
        filters: SearchFilters | None,
        language: LanguageInfo,
    ) -> str | None:
        """The result cache's key of a text search; None when the cache is off."""
        if not self.cache.enabled:
            return None
        return digest(
            [
                served.version,
                self.model_fingerprint,  # of the query side: a language added to the model changes it
                text,
                request.top_k,
                request.offset,
                rerank,
                request.rerank_k if rerank else 0,
                self.rerank_score if rerank else None,  # another score orders the shortlist otherwise
                None if filters is None else filters.plain,
                language.code,  # match labels are calibrated per language
                request.min_score,
            ]
        )

    # -- image -----------------------------------------------------------------------------------------------

    def image(
        self,
        served: Served,
        data: bytes,
        content_type: str | None,
        *,
        top_k: int,
        offset: int,
        filters: SearchFilters | None,
    ) -> ImageOutcome:
        start = time.perf_counter()
        image = decode_upload(
            data,
            content_type,
            max_bytes=self.max_upload_bytes,
            max_pixels=self.max_query_pixels,
            image_size=self.encoder.config.vision.image_size,
        )
        allowed = allowed_rows(filters, served)
        t0 = time.perf_counter()
        embeds = self.encoder.encode_images([image]).embeds
        encode_s = time.perf_counter() - t0
        del image  # up to ~100 MB of pixels: not kept through the search
        ranked = self.ranker.by_embedding(served, embeds, top_k=top_k, offset=offset, allowed=allowed)
        return ImageOutcome(self.responses.image(served, ranked, encode_s=encode_s, start=start), ranked)

    # -- consistency -----------------------------------------------------------------------------------------

    def consistency(self, served: Served, body: ConsistencyRequest) -> ConsistencyOutcome:
        """Each language's result ids, compared (``monitoring.consistency``)."""
        self.resolve_rerank(body.rerank)  # a request the model cannot honour is refused before any work
        allowed = allowed_rows(SearchFilters.of(body.filters), served)  # the same rows for every language
        rerank_k = max(body.top_k, self.default_rerank_k)
        per_language, ranked_all = [], []
        for lang, raw in body.queries.items():
            text = normalise_query(raw)
            ranked = self.ranker.text(
                served,
                self.ranker.encode_text(text, lang),
                top_k=body.top_k,
                offset=0,
                rerank=self.resolve_rerank(body.rerank, lang),
                rerank_k=rerank_k,
                allowed=allowed,
            )
            ranked_all.append(ranked)
            per_language.append(
                LanguageResults(
                    lang=lang,
                    query=text,
                    ids=self.responses.ids(served, ranked),
                    language=self.detector.resolve(text, lang),
                )
            )
        report = consistency_report({r.lang: r.ids for r in per_language}, body.top_k)
        response = self.responses.consistency(served, top_k=body.top_k, languages=per_language, report=report)
        return ConsistencyOutcome(response, ranked_all)
