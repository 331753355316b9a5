"""Search answers, built in one place: the hits of a ranked page (metadata, image link), and the text
answer (fresh, or read back from the result cache), the image answer and the consistency answer."""

from __future__ import annotations

import json
import re
import time
from typing import Any
from urllib.parse import quote

import numpy as np

from service.index_holder import DEFAULT_IMAGE_BASE, Served
from service.schemas import (
    ConsistencyResponse,
    ImageSearchResponse,
    LanguageInfo,
    LanguageResults,
    MatchLabel,
    MatchThresholdsInfo,
    SearchHit,
    SearchResponse,
    Timings,
)
from service.search.ranking import Ranked
from store.products.hybrid import GroupParams

# An id of only the characters ``quote`` never escapes (letters, digits, ``_.-~``) is its own quoted form:
# most catalogue ids, spared ``quote``'s per-character work (~1.5 us a hit).
_PLAIN_ID = re.compile(r"[A-Za-z0-9_.~-]+")


def image_url(item_id: str, base: str = DEFAULT_IMAGE_BASE) -> str:
    """Where a result's image is served: ``{base}/{id}``, or ``{base}?id=...`` for an id with a line break (a
    URL path cannot match one: it got a link that answered 404) and for ``.`` and ``..`` (clients remove such
    path segments: the link answered 422). ``base``: the image route of the hit's index
    (``Served.image_base``: ``/v1/images`` for the default index)."""
    if item_id in (".", ".."):
        return f"{base}?id={item_id}"
    if _PLAIN_ID.fullmatch(item_id):
        return f"{base}/{item_id}"
    if "\n" in item_id or "\r" in item_id:
        return f"{base}?id={quote(item_id, safe='')}"
    return f"{base}/{quote(item_id, safe='')}"


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def since_ms(start: float) -> float:
    """Milliseconds since a ``time.perf_counter()`` reading (a response's ``total``)."""
    return ms(time.perf_counter() - start)


class ResponseBuilder:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

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
                    image_url=image_url(item_id, served.image_base),
                )
            )
        return hits

    def ids(self, served: Served, ranked: Ranked) -> list[str]:
        """Result ids only (the consistency report compares lists of ids)."""
        return [item["id"] for item in served.items(ranked.rows.tolist())]

    def text(
        self,
        served: Served,
        *,
        hits: list[SearchHit],
        label: MatchLabel | None,
        thresholds: MatchThresholdsInfo,
        match_score: float | None = None,
        language: LanguageInfo,
        ranked: Ranked,
        encode_s: float,
        start: float,
    ) -> SearchResponse:
        return SearchResponse(
            match=label,
            match_thresholds=thresholds,
            match_score=match_score,
            results=hits,
            language=language,
            index_version=served.version,
            model=self.model_name,
            reranked=ranked.reranked,
            timings_ms=Timings(
                encode=ms(encode_s),
                search=ms(ranked.search_s),
                rerank=ms(ranked.rerank_s),
                total=since_ms(start),
            ),
            cached=False,
        )

    def hybrid(
        self,
        served: Served,
        hits: list[SearchHit],
        *,
        label: MatchLabel | None,
        params: GroupParams | None,
        match_score: float | None = None,
        search_s: float,
        mode: str,
        rerank_s: float = 0.0,
        reranked: bool = False,
        language: LanguageInfo,
        encode_s: float,
        start: float,
    ) -> SearchResponse:
        """A products / hybrid search answer (``service.search.hybrid``): ``match_score`` is what ``label``
        reads, None where nothing is labelled (``HybridPage.match_score``), so only with thresholds."""
        thresholds = None
        if params is not None and params.none_below is not None:
            # No strong_from (a hand-edited version): nothing is labelled strong (``hybrid.label_of``).
            thresholds = MatchThresholdsInfo(none_below=params.none_below, strong_from=params.strong_from)
        return SearchResponse(
            results=hits,
            mode=mode,  # type: ignore[arg-type]
            language=language,
            index_version=served.version,
            model=self.model_name,
            reranked=reranked,
            timings_ms=Timings(
                encode=ms(encode_s), search=ms(search_s), rerank=ms(rerank_s), total=since_ms(start)
            ),
            cached=False,
            match=label,
            match_thresholds=thresholds,
            match_score=match_score,
        )

    def visual(
        self, served: Served, hits: list[SearchHit], *, encode_s: float, search_s: float, start: float
    ) -> ImageSearchResponse:
        """An image-to-image answer over products (their photos' visual embeddings)."""
        return ImageSearchResponse(
            results=hits,
            index_version=served.version,
            model=self.model_name,
            timings_ms=Timings(encode=ms(encode_s), search=ms(search_s), rerank=0.0, total=since_ms(start)),
        )

    @staticmethod
    def cache_entry(response: SearchResponse) -> bytes:
        """What the result cache keeps of a text answer: the parts that do not depend on the request's
        language resolution or timing."""
        payload: dict[str, Any] = {
            "results": [hit.model_dump() for hit in response.results],
            "reranked": response.reranked,
            "mode": response.mode,
            "match": response.match,
            "match_thresholds": response.match_thresholds.model_dump() if response.match_thresholds else None,
            "match_score": response.match_score,
            "facets": None if response.facets is None else [f.model_dump() for f in response.facets],
            "corrected_query": response.corrected_query,
        }
        return json.dumps(payload).encode()

    def cached_text(
        self, served: Served, entry: bytes, *, language: LanguageInfo, start: float
    ) -> SearchResponse | None:
        """A text answer from a result-cache entry; None for an entry that cannot be read (compute afresh)."""
        try:
            payload = json.loads(entry)
            return SearchResponse(
                results=[SearchHit(**hit) for hit in payload["results"]],
                language=language,
                index_version=served.version,
                model=self.model_name,
                reranked=payload["reranked"],
                mode=payload.get("mode", "image"),
                timings_ms=Timings(encode=0.0, search=0.0, rerank=0.0, total=since_ms(start)),
                cached=True,
                match=payload["match"],
                match_thresholds=payload["match_thresholds"],
                match_score=payload["match_score"],
                facets=payload.get("facets"),
                corrected_query=payload.get("corrected_query"),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def image(self, served: Served, ranked: Ranked, *, encode_s: float, start: float) -> ImageSearchResponse:
        return ImageSearchResponse(
            results=self.hits(served, ranked),
            index_version=served.version,
            model=self.model_name,
            timings_ms=Timings(
                encode=ms(encode_s), search=ms(ranked.search_s), rerank=0.0, total=since_ms(start)
            ),
        )

    def consistency(
        self,
        served: Served,
        *,
        top_k: int,
        languages: list[LanguageResults],
        report: dict[str, Any],
        mode: str = "image",
    ) -> ConsistencyResponse:
        return ConsistencyResponse(
            top_k=top_k,
            mode=mode,  # type: ignore[arg-type]
            index_version=served.version,
            model=self.model_name,
            languages=languages,
            **report,
        )
