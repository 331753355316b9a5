"""The search pipelines, each a method run on one leased version: text (language, the served version's
languages and words its prior -> typo correction -> synonym variants -> result cache -> encode -> ANN,
filtered -> re-rank -> page -> metadata -> match labels -> facets), image (decode -> encode -> ANN, filtered
-> page -> metadata -> facets), more like this, and consistency (one intent in several languages, compared).

Over 400 lines: one method per kind of search, each the whole of that search's path (the products path of a
text query beside the dual encoder's, which it leaves as it was), so each reads in one place; and the text
search's order of the issue-43 steps (correction before expansion before encoding; the facets' re-rankings
through the same ``_hybrid_page`` as the page, so they see the same correction, variants and rules), which
is what a reader has to check and would have to follow across modules if split. The steps themselves live
in their modules (``facets``, ``typos``, ``synonyms``, ``rules``).

Everything here is blocking (ONNX Runtime, faiss, sqlite, Redis) and runs in a worker thread
(``service.search.facade``), except a short text search (``is_short``), which runs on the event loop.
It records no metrics: each method returns what it did with its answer, and the facade hands that to the
telemetry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import numpy as np

from model.reranking import RerankScore
from model.runtime import EncodedTexts, Encoder
from monitoring.consistency import consistency_report
from service.cache import RESULT, Cache
from service.errors import InvalidInputError, NotFoundError
from service.index_holder import Served
from service.language import LanguageDetector, catalogue_languages
from service.matching import MatchJudge
from service.schemas import (
    MAX_OFFSET,
    MAX_TOP_K,
    ConsistencyRequest,
    ConsistencyResponse,
    FacetResult,
    FacetSpec,
    ImageSearchResponse,
    LanguageInfo,
    LanguageResults,
    MatchThresholdsInfo,
    SearchRequest,
    SearchResponse,
    SimilarRequest,
)
from service.search.compounds import QueryCompounds
from service.search.dictionaries import QueryDictionaries
from service.search.facets import check_fields, columns_of, facet_counts, spread_hits
from service.search.filters import SearchFilters, allowed_rows
from service.search.hybrid import HybridPage, HybridRanker, channels_of, is_certain
from service.search.query import digest, normalise_query
from service.search.ranking import Ranked, Ranker, RerankPolicyName
from service.search.responses import ResponseBuilder, since_ms
from service.search.rules import RuleBook
from service.search.synonyms import SynonymSource, expanded_query
from service.search.typos import Correction, correct_query
from service.uploads import decode_upload
from store.products.channels import ProductChannels, default_mode
from store.products.hybrid import CANDIDATES
from store.shards.sharded import ShardedIndex
from store.version.reader import IndexVersion

# What a result-cache entry holds (``ResponseBuilder.cache_entry``), in its key: entries of another format are
# not read (2: with ``match_score``; before it, a cached answer came back labelled but without its score).
RESULT_FORMAT = 2
INLINE_MAX_SHARDS = 4  # local shards or segments a search may walk on the event loop
INLINE_MAX_RESULTS = 50  # offset + top_k of a search answered on the event loop
DIVERSITY_DEPTH = MAX_OFFSET + MAX_TOP_K  # the dual encoder's ranking a max_per page may draw from


@dataclass
class TextOutcome:
    response: SearchResponse
    ranked: Ranked | None  # None for an answer from the result cache (nothing encoded or ranked)
    encode_s: float = 0.0


@dataclass
class ImageOutcome:
    response: ImageSearchResponse
    ranked: Ranked | None  # None for products ranked by their photos' visual embeddings


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
        rerank_policy: RerankPolicyName = "full",
        max_query_pixels: int = 24_000_000,
    ) -> None:
        self.encoder = encoder
        self.model_name = model_name
        self.model_fingerprint = model_fingerprint
        self.detector = detector
        self.cache = cache
        self.ranker = Ranker(
            encoder,
            cache,
            model_fingerprint=model_fingerprint,
            rerank_score=rerank_score,
            rerank_policy=rerank_policy,
        )
        self.responses = ResponseBuilder(model_name)
        self.judge = MatchJudge(encoder)
        # Typo tolerance's query-language dictionaries, each built on its first use; decompounding's too.
        self.dictionaries = QueryDictionaries(detector.supported)
        self.hybrid = HybridRanker(QueryCompounds(self.dictionaries))
        self.synonyms = SynonymSource()  # each served version's synonyms, the index-level set over its own
        self.rules = RuleBook(self.rule_embedding)  # merchandising rules (``service.search.rules``)
        # A model without a fusion encoder cannot re-rank: its default is off, and asking is refused.
        self.can_rerank = encoder.capabilities.rerank
        self.default_rerank = default_rerank and self.can_rerank
        self.default_rerank_k = default_rerank_k
        self.rerank_score = rerank_score
        self.max_upload_bytes = max_upload_bytes
        self.max_query_pixels = max_query_pixels

    def rule_embedding(self, query: str, lang: str | None) -> np.ndarray:
        """A merchandising rule's query embedded as a search query is (normalised, its language resolved)."""
        text = normalise_query(query)
        return self.ranker.encode_text(text, self.detector.resolve(text, lang).code).embeds[0]

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

    def is_short(self, served: Served, request: SearchRequest) -> bool:
        """Whether a text search is short enough to answer on the event loop (``SearchFacade.text``):
        a query encoding, an ANN walk and a page of metadata from the version's row cache, ~1 ms of CPU,
        less than a worker thread hop costs under load. Not short: re-ranking (tens of ms), filters (a
        metadata scan), a deep page (offset + top_k over ``INLINE_MAX_RESULTS``: a wide ANN walk and
        re-scoring), product channels (the lexical channel), a version of many shards or remote ones
        (Ray) and a Redis cache (network round trips). A version of a few local segments (a small rebuild's,
        ``indexer.segments``) is short: its new segments are small exact indexes."""
        rerank = request.rerank if request.rerank is not None else self.default_rerank
        if request.offset + request.top_k > INLINE_MAX_RESULTS:  # a deep page: a wide ANN walk
            return False
        index = getattr(served.index, "base", served.index)  # a live view's version (``service.live``)
        local = isinstance(index, IndexVersion) or (
            isinstance(index, ShardedIndex) and len(index.shards) <= INLINE_MAX_SHARDS
        )
        return (
            not rerank
            and not request.filters
            and not request.facets  # counted over every relevant result: a deeper ranking
            and request.max_per is None
            and self.cache.backend == "memory"
            and local
            and channels_of(served) is None
            # Synonyms: a variant is one more encoding per query, kept off the event loop.
            and self.synonyms.of(getattr(served.index, "path", None)) is None
        )

    def text(self, served: Served, request: SearchRequest) -> TextOutcome:
        start = time.perf_counter()
        text = normalise_query(request.query)
        if not text:
            raise InvalidInputError("query is empty after whitespace normalisation", loc=("body", "query"))
        # The served version's languages and vocabulary are the prior of an unhinted query's language.
        catalogue = None if request.lang else catalogue_languages(channels_of(served))
        language = self.detector.resolve(text, request.lang, catalogue)
        rerank = self.resolve_rerank(request.rerank, language.code)
        filters = SearchFilters.of(request.filters)
        check_fields(request.facets, request.max_per, served.index.fields, request.sort)
        # Mistyped words corrected first (service.search.typos): a typo moves the embedding too, and a
        # corrected word may be one a synonym expands.
        correction = correct_query(
            channels_of(served),
            text,
            [language.code],
            request.typos,
            certain=is_certain(language),
            dictionaries=self.dictionaries,
        )
        searched = text if correction is None else correction.text
        # Synonyms (service.search.synonyms): variants of the query, searched by every channel.
        synonyms = self.synonyms.of(getattr(served.index, "path", None))
        lang = language.code if language.code != "und" else None
        expansion = synonyms.expand(searched, lang) if synonyms is not None and request.synonyms else None
        variants = list(expansion.variants) if expansion is not None else []
        result_key = self._result_key(served, request, text, rerank, filters, language)
        if result_key is not None and synonyms is not None and request.synonyms:
            result_key = digest([result_key, synonyms.key])  # the answer depends on the served set
        if result_key is not None:
            entry = self.cache.get(RESULT, result_key)
            if entry is not None:
                cached = self.responses.cached_text(served, entry, language=language, start=start)
                if cached is not None:  # else an unreadable entry: compute afresh
                    cached.expanded = variants
                    return TextOutcome(cached, ranked=None)
        allowed = allowed_rows(filters, served)
        t0 = time.perf_counter()
        query = self.ranker.encode_text(searched, language.code)
        if variants:
            query = expanded_query(query, [self.ranker.encode_text(v, language.code) for v in variants])
        encode_s = time.perf_counter() - t0
        channels = channels_of(served)
        mode = self._mode(channels, request)
        ranked: Ranked | None = None
        relevant: np.ndarray | None = None  # the products path's relevant rows, which facets count
        if channels is not None and self._products_path(served, channels, mode, request):
            response, relevant = self._products_text(
                served,
                channels,
                request,
                query,
                text,
                language,
                mode,
                rerank,
                allowed,
                encode_s,
                start,
                variants,
                correction,
            )
        else:
            if request.sort is not None:
                raise InvalidInputError(
                    "sort needs an index built with products (--text-fields or photos lists); this version "
                    "has none",
                    loc=("body", "sort"),
                )
            # Diversity moves results down from later pages: those are ranked too (twice the depth).
            deep = request.max_per is not None
            ranked = self.ranker.text(
                served,
                query,
                top_k=min(2 * (request.offset + request.top_k), DIVERSITY_DEPTH) if deep else request.top_k,
                offset=0 if deep else request.offset,
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
            hits = judged.hits
            if request.max_per is not None:
                hits = spread_hits(hits, request.max_per, request.top_k, request.offset)
            response = self.responses.text(
                served,
                hits=hits,
                label=judged.label,
                thresholds=MatchThresholdsInfo(**vars(judged.thresholds)),
                match_score=judged.score,  # None exactly where nothing is labelled (no top score)
                language=language,
                ranked=ranked,
                encode_s=encode_s,
                start=start,
            )
        if request.facets:
            response.facets = self._text_facets(
                served,
                channels,
                request,
                query,
                text,
                language,
                mode,
                filters,
                relevant,
                variants,
                correction,
            )
            response.timings_ms.total = since_ms(start)
        response.expanded = variants
        if correction is not None:
            response.corrected_query = correction.text
        if result_key is not None:
            self.cache.set(RESULT, result_key, self.responses.cache_entry(response))
            response.timings_ms.total = since_ms(start)  # the total includes the cache write
        return TextOutcome(response, ranked=ranked, encode_s=encode_s)

    def _text_facets(
        self,
        served: Served,
        channels: ProductChannels | None,
        request: SearchRequest,
        query: EncodedTexts,
        text: str,
        language: LanguageInfo,
        mode: str,
        filters: SearchFilters | None,
        relevant_rows: np.ndarray | None,
        variants: list[str],
        correction: Correction | None,
    ) -> list[FacetResult]:
        """A text search's facets (``service.search.facets``): over its relevant results, and for a field it
        filters on, over those of the same query without that filter."""
        assert request.facets is not None
        products = channels is not None and self._products_path(served, channels, mode, request)

        def relevant(scope: SearchFilters | None) -> np.ndarray:
            allowed = allowed_rows(scope, served)
            if products:
                assert channels is not None
                return self._hybrid_page(
                    served,
                    channels,
                    request,
                    query,
                    text,
                    language,
                    mode,
                    allowed,
                    variants,
                    correction,
                    want_hits=False,
                ).relevant
            return self._photo_relevant(served, query, allowed, request, language)

        return facet_counts(
            request.facets, filters, relevant, served.values_of, relevant_rows, columns_of(served)
        )

    def _photo_relevant(
        self,
        served: Served,
        query: EncodedTexts,
        allowed: np.ndarray | None,
        request: SearchRequest,
        language: LanguageInfo,
    ) -> np.ndarray:
        """The relevant rows of a text query on the dual encoder's path: its ranking to the depth a product
        search gathers (``CANDIDATES``, or offset + top_k), kept by the ``min_score`` cut on the calibrated
        cosine labels ('auto': those not labelled none)."""
        depth = max(CANDIDATES, request.offset + request.top_k)
        ranked = self.ranker.by_embedding(served, query.embeds, top_k=depth, offset=0, allowed=allowed)
        thresholds = self.judge.calibration(served).thresholds(language.code if language.supported else None)
        cut = "weak" if request.min_score == "auto" else request.min_score
        scores = ranked.scores
        if cut == "weak":
            keep = scores >= thresholds.none_below
        elif cut == "strong":
            keep = scores >= thresholds.strong_from
        else:
            keep = scores >= float(cut)
        return ranked.rows[keep]

    @staticmethod
    def _products_path(
        served: Served, channels: ProductChannels, mode: str, request: SearchRequest | ConsistencyRequest
    ) -> bool:
        """Whether a query goes through the product channels: hybrid and text always; image too where a
        product has several photos (best photo wins) or the request sorts or explains. A one-photo catalogue
        in mode image keeps the dual encoder's own path (its answers exactly as without text fields)."""
        extras = isinstance(request, SearchRequest) and (request.sort is not None or request.explain)
        return mode != "image" or channels.info.photos > served.index.total_rows or extras

    def _products_text(
        self,
        served: Served,
        channels: ProductChannels,
        request: SearchRequest,
        query: EncodedTexts,
        text: str,
        language: LanguageInfo,
        mode: str,
        rerank: bool,
        allowed: np.ndarray | None,
        encode_s: float,
        start: float,
        variants: list[str],
        correction: Correction | None,
    ) -> tuple[SearchResponse, np.ndarray]:
        """A text query's products (``service.search.hybrid``), the CCRk fusion encoder re-ranking on top,
        and the rows of its relevant results (what facets count)."""
        page = self._hybrid_page(
            served,
            channels,
            request,
            query,
            text,
            language,
            mode,
            allowed,
            variants,
            correction,
            rerank=rerank,
        )
        label, params = page.label, page.thresholds
        response = self.responses.hybrid(
            served,
            page.hits,
            label=label,
            params=params,
            match_score=page.match_score,
            search_s=page.search_s,
            rerank_s=page.rerank_s,
            reranked=page.reranked > 0,
            mode=mode,
            language=language,
            encode_s=encode_s,
            start=start,
        )
        return response, page.relevant

    def _hybrid_page(
        self,
        served: Served,
        channels: ProductChannels,
        request: SearchRequest,
        query: EncodedTexts,
        text: str,
        language: LanguageInfo,
        mode: str,
        allowed: np.ndarray | None,
        variants: list[str],
        correction: Correction | None,
        *,
        rerank: bool = False,
        want_hits: bool = True,
    ) -> HybridPage:
        """A text query's products ranking (``HybridRanker.text``), the one call the page and each facet's
        re-ranking under other filters (``want_hits`` False) share, so that they read the same corrected
        query, synonym variants and cut. The acting rules are matched afresh for each ranking: an
        ``ActingRules`` records the pins it placed under that ranking's filters."""
        reranker = partial(self.ranker.rerank_head, served, query) if rerank and mode != "text" else None
        # Labels where nothing was calibrated for the fused score: the photos' cosine, as the dual encoder's.
        cosine = self.judge.calibration(served).thresholds(language.code if language.supported else None)
        return self.hybrid.text(
            served,
            channels,
            query.embeds[0],
            text,
            language,
            mode=mode,
            top_k=request.top_k,
            offset=request.offset,
            allowed_rows=allowed,
            min_score=request.min_score,
            sort=request.sort,
            explain=request.explain,
            rerank=reranker,
            rerank_k=request.rerank_k,
            cosine_labels=(cosine.none_below, cosine.strong_from),
            max_per=request.max_per,
            want_hits=want_hits,
            variants=variants,
            correction=correction,
            rules=self.rules.match(served, query.embeds[0]),
        )

    @staticmethod
    def _mode(channels: ProductChannels | None, request: SearchRequest | ConsistencyRequest) -> str:
        """The request's mode, else the version's default (``store.products.channels.default_mode``)."""
        default = default_mode(channels)
        if request.mode is None:
            return default
        if request.mode != "image" and default == "image":  # no searched text fields
            raise InvalidInputError(
                f"mode {request.mode!r} needs searched text fields, and this index has none (build it with "
                "--text-fields); use mode 'image' or leave mode out",
                loc=("body", "mode"),
            )
        return request.mode

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
                RESULT_FORMAT,
                served.version,
                getattr(served.index, "live_sequence", 0),  # the product writes it shows (``service.live``)
                served.image_base,  # the hits' links: a version may be served as another process's default
                self.model_fingerprint,  # of the query side: a language added to the model changes it
                text,
                request.top_k,
                request.offset,
                rerank,
                request.rerank_k if rerank else 0,
                self.rerank_score if rerank else None,  # another score orders the shortlist otherwise
                self.ranker.rerank_policy if rerank else None,  # and another policy re-ranks fewer
                None if filters is None else filters.plain,
                language.code,  # match labels are calibrated per language
                is_certain(language),  # an uncertain one's labels may be another group's (products)
                request.min_score,
                request.mode,
                request.explain,
                None if request.sort is None else request.sort.model_dump_json(),
                None if request.facets is None else [f.model_dump_json() for f in request.facets],
                None if request.max_per is None else request.max_per.model_dump_json(),
                request.typos,
                self.rules.etag(served),  # an edited rule is not hidden by an answer cached before it
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
        facets: list[FacetSpec] | None = None,
    ) -> ImageOutcome:
        start = time.perf_counter()
        check_fields(facets, None, served.index.fields)
        image = decode_upload(
            data,
            content_type,
            max_bytes=self.max_upload_bytes,
            max_pixels=self.max_query_pixels,
            image_size=self.encoder.config.vision.image_size,
        )
        allowed = allowed_rows(filters, served)
        t0 = time.perf_counter()
        encoded = self.encoder.encode_images([image])
        encode_s = time.perf_counter() - t0
        del image  # up to ~100 MB of pixels: not kept through the search
        channels = channels_of(served)
        if channels is not None:  # products: ranked by their best photo's visual embedding
            hits, search_s = self.hybrid.visual(
                served,
                channels,
                encoded.visual_or_embeds[0],
                top_k=top_k,
                offset=offset,
                allowed_rows=allowed,
            )
            response = self.responses.visual(served, hits, encode_s=encode_s, search_s=search_s, start=start)
            outcome = ImageOutcome(response, None)
            query = encoded.visual_or_embeds[0]
        else:
            ranked = self.ranker.by_embedding(
                served, encoded.embeds, top_k=top_k, offset=offset, allowed=allowed
            )
            outcome = ImageOutcome(
                self.responses.image(served, ranked, encode_s=encode_s, start=start), ranked
            )
            query = encoded.embeds
        if facets:
            depth = max(CANDIDATES, offset + top_k)  # no calibrated cut for photo queries (as ``similar``)
            outcome.response.facets = facet_counts(
                facets,
                filters,
                lambda scope: self._nearest_rows(served, channels, query, scope, depth),
                served.values_of,
                columns=columns_of(served),
            )
            outcome.response.timings_ms.total = since_ms(start)
        return outcome

    # -- more like this --------------------------------------------------------------------------------------

    def similar(self, served: Served, item_id: str, body: SimilarRequest) -> ImageSearchResponse:
        """Products like an indexed one, by its stored photo vectors (its first photo's; no upload)."""
        start = time.perf_counter()
        row = served.index.row_of(item_id)
        if row is None:
            raise NotFoundError(
                f"no item {item_id!r} in index version {served.version}", loc=("path", "item_id")
            )
        check_fields(body.facets, body.max_per, served.index.fields)
        filters = SearchFilters.of(body.filters)
        exclude = None if body.include_self else row
        channels = channels_of(served)
        if channels is not None:
            query = np.asarray(
                channels.visual_vectors.vectors[channels.visual_vectors.start[row]], np.float32
            )
        else:
            query = served.index.embeddings(np.asarray([row]))

        deep = body.max_per is not None  # diversity moves results down from later pages: rank those too
        top_k = min(2 * (body.offset + body.top_k), DIVERSITY_DEPTH) if deep else body.top_k
        offset = 0 if deep else body.offset
        allowed = allowed_rows(filters, served)
        if channels is not None:
            hits, search_s = self.hybrid.visual(
                served,
                channels,
                query,
                top_k=top_k,
                offset=offset,
                allowed_rows=allowed,
                exclude_row=exclude,
            )
            response = self.responses.visual(served, hits, encode_s=0.0, search_s=search_s, start=start)
        else:
            ranked = self.ranker.by_embedding(
                served, query, top_k=top_k, offset=offset, allowed=without_row(served, allowed, exclude)
            )
            response = self.responses.image(served, ranked, encode_s=0.0, start=start)
        if body.max_per is not None:
            response.results = spread_hits(response.results, body.max_per, body.top_k, body.offset)
        if body.facets:
            # Photo similarity has no calibrated cut: the facets count as deep as a text search gathers.
            depth = max(CANDIDATES, body.offset + body.top_k)
            response.facets = facet_counts(
                body.facets,
                filters,
                lambda scope: self._nearest_rows(served, channels, query, scope, depth, exclude),
                served.values_of,
                columns=columns_of(served),
            )
            response.timings_ms.total = since_ms(start)
        return response

    def _nearest_rows(
        self,
        served: Served,
        channels: ProductChannels | None,
        query: np.ndarray,
        scope: SearchFilters | None,
        depth: int,
        exclude: int | None = None,
    ) -> np.ndarray:
        """The ``depth`` rows nearest a photo query under ``scope``'s filters, best first, ``exclude`` left
        out: what the facets of a photo or "more like this" search count."""
        allowed = allowed_rows(scope, served)
        if channels is not None:
            return self.hybrid.visual_rows(served, channels, query, depth, allowed, exclude)
        allowed = without_row(served, allowed, exclude)
        return self.ranker.by_embedding(served, query, top_k=depth, offset=0, allowed=allowed).rows

    # -- consistency -----------------------------------------------------------------------------------------

    def consistency(self, served: Served, body: ConsistencyRequest) -> ConsistencyOutcome:
        """Each language's result ids, compared (``monitoring.consistency``)."""
        self.resolve_rerank(body.rerank)  # a request the model cannot honour is refused before any work
        allowed = allowed_rows(SearchFilters.of(body.filters), served)  # the same rows for every language
        rerank_k = max(body.top_k, self.default_rerank_k)
        channels = channels_of(served)
        mode = self._mode(channels, body)
        per_language, ranked_all = [], []
        for lang, raw in body.queries.items():
            text = normalise_query(raw)
            if channels is not None and self._products_path(served, channels, mode, body):
                language = self.detector.resolve(text, lang)
                page = self.hybrid.text(
                    served,
                    channels,
                    self.ranker.encode_text(text, lang).embeds[0],
                    text,
                    language,
                    mode=mode,
                    top_k=body.top_k,
                    offset=0,
                    allowed_rows=allowed,
                    min_score="auto",
                    sort=None,
                    explain=False,
                )
                ids = [hit.id for hit in page.hits]
                per_language.append(LanguageResults(lang=lang, query=text, ids=ids, language=language))
                continue
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
        response = self.responses.consistency(
            served, top_k=body.top_k, languages=per_language, report=report, mode=mode
        )
        return ConsistencyOutcome(response, ranked_all)


def without_row(served: Served, allowed: np.ndarray | None, row: int | None) -> np.ndarray | None:
    """The allowed rows (None: every row) less ``row`` (None: none left out)."""
    if row is None:
        return allowed
    keep = allowed if allowed is not None else np.arange(served.index.total_rows)
    return keep[keep != row]
