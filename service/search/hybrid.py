"""Products and hybrid search on a version with product channels (``store.products.channels``): one ranking of
products fused from the photos, the text fields' embeddings and BM25 (``store.products.hybrid``, with the
fusion
calibrated at build time), match labels of the fused score, the ``min_score`` cut, ``sort``, paging, and
the hits' photos and explanations. Image-to-image search (an uploaded photo, "more like this") ranks
products by their best photo's visual embedding.

Blocking (faiss, tantivy, SQLite); runs in the facade's worker thread like the rest of the pipeline.
Over 400 lines: one ranking's steps on the same candidates (fusion, the merchandising rules' hooks in
their places, labels, the cut, sort, ``max_per``, pins, paging, hits and their explanations): their order is
the contract (hidden products dropped before re-ranking and labels, boosts before the cut, pins after sort
and ``max_per``), and it reads in one method.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from indexer.match_calibration import MatchThresholds
from service.index_holder import Served
from service.schemas import (
    ChannelScore,
    HitExplanation,
    LanguageInfo,
    MatchLabel,
    MaxPer,
    MinScore,
    SearchHit,
    SortBy,
)
from service.search.compounds import QueryCompounds
from service.search.facets import spread
from service.search.responses import image_url
from service.search.rules import ActingRules
from service.search.typos import Correction
from store.products.channels import ProductChannels
from store.products.hybrid import (
    CANDIDATES,
    CHANNELS,
    FEATURES,
    OTHER,
    Candidates,
    FusionModel,
    GroupParams,
    HybridQuery,
    StoredFusion,
    gather,
    match_scores,
    query_match_score,
)
from store.products.vectors import ChannelHits
from store.text.lexical import analyze, readings_of, union_of

log = logging.getLogger(__name__)

RRF_K = 60.0
CENTROID = FEATURES.index("centroid")
COVERAGE = FEATURES.index("coverage")
# (product rows, their best image cosines) -> re-rank scores (``service.search.ranking.Ranker.rerank_head``).
Reranker = Callable[[np.ndarray, np.ndarray], np.ndarray]
CONFIDENT = 0.9  # below this detection confidence a query is analysed for each likely language
LABEL_ORDER: dict[MatchLabel | None, int] = {None: -1, "none": 0, "weak": 1, "strong": 2}


def is_certain(language: LanguageInfo) -> bool:
    """Whether a query's language is known (hinted, or detected at ``CONFIDENT``): an uncertain one is
    analysed for each likely language and labelled by the better of two groups (``HybridRanker.text``)."""
    return language.source == "hint" or language.confidence >= CONFIDENT


def channels_of(served: Served) -> ProductChannels | None:
    return getattr(served.index, "products", None)


def photo_url(item_id: str, photo: int, base: str) -> str:
    """The link of a product's ``photo``-th image, under its index's image route ``base``."""
    base = image_url(item_id, base)
    if photo <= 0:
        return base
    return f"{base}{'&' if '?' in base else '?'}photo={photo}"


def allowed_mask(served: Served, rows: np.ndarray | None) -> np.ndarray | None:
    """Live rows matching the filters as a boolean mask over the version's rows (None: every row)."""
    live = served.index.live_mask() if hasattr(served.index, "live_mask") else None
    if rows is None:
        return live
    mask = np.zeros(served.index.total_rows, bool)
    mask[np.asarray(rows, np.int64)] = True
    return mask if live is None else mask & live


@dataclass
class HybridPage:
    hits: list[SearchHit]
    label: MatchLabel | None
    thresholds: GroupParams | None  # what the labels read (None: nothing is labelled)
    search_s: float
    rerank_s: float = 0.0
    reranked: int = 0  # products the fusion encoder scored; 0 when not re-ranked
    match_score: float | None = None  # what ``label`` reads (None: nothing labelled)
    # Product rows of every result the min_score cut keeps ('auto': those not labelled none), ranked: what
    # facets count.
    relevant: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def stored_languages(info: Any) -> list[str]:
    """The catalogue languages a version's stored fusion names, read leniently, among those its text values
    are in: where the fusion cannot be parsed (searched by reciprocal rank), an uncertain query is still
    read for the shop's languages, as with a fusion fitted by reciprocal rank (``indexer.fusion_calibration``:
    too little text), and a damaged list adds no reading the text could match."""
    fusion = info.fusion
    languages = fusion.get("languages") if isinstance(fusion, dict) else None
    if not isinstance(languages, list):
        return []
    written = set(getattr(info, "language_counts", None) or {})
    return [x for x in languages if isinstance(x, str) and x in written]


def label_of(score: float, params: GroupParams | None) -> MatchLabel | None:
    """A match score's label by a group's thresholds (``indexer.match_calibration.MatchThresholds``); None
    where nothing was calibrated."""
    if params is None or params.none_below is None:
        return None
    strong_from = params.strong_from if params.strong_from is not None else math.inf
    return MatchThresholds(params.none_below, strong_from).label(score)


def kept_by_cut(
    order: np.ndarray, quality: np.ndarray, scores: np.ndarray, params: GroupParams | None, cut: MinScore
) -> np.ndarray:
    """The candidates of ``order`` a ``min_score`` cut keeps, in order: the labels' rule (``label_of``) on the
    whole array ("weak" keeps all but none, "strong" only strong; with nothing calibrated "weak" keeps all
    and "strong" none), a number a floor on the fused score; "auto" keeps all."""
    if cut in ("weak", "strong") and params is not None and params.none_below is not None:
        strong_from = params.strong_from if params.strong_from is not None else math.inf
        q = quality[order]
        strong = q >= strong_from
        return order[strong | ~(q < params.none_below)] if cut == "weak" else order[strong]
    if cut == "strong":  # nothing calibrated: no label is strong
        return order[:0]
    if not isinstance(cut, str):
        return order[scores[order] >= cut]
    return order


def sorted_by_field(pairs: list[tuple[int, dict[str, Any]]], name: str, order: str) -> list[tuple[int, Any]]:
    """(candidate, item) pairs ordered by a metadata field: numbers, then text, each in ``order``; items
    without the field (or with another type: a list, a boolean, NaN) last, in their relevance order."""
    numbers, texts, rest = [], [], []
    for pair in pairs:
        value = pair[1].get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value == value:
            numbers.append(pair)
        elif isinstance(value, str):
            texts.append(pair)
        else:
            rest.append(pair)
    desc = order == "desc"
    numbers.sort(key=lambda p: p[1][name], reverse=desc)  # stable: ties keep their relevance order
    texts.sort(key=lambda p: p[1][name], reverse=desc)
    return numbers + texts + rest


class HybridRanker:
    """Thread-safe."""

    def __init__(self, compounds: QueryCompounds | None = None) -> None:
        # Compound query words split for the lexical channel (``service.search.compounds``); None: not split.
        self.compounds = compounds
        # Each served version's fusion model, parsed once (not on every query); dropped with the version.
        self._models: weakref.WeakKeyDictionary[ProductChannels, StoredFusion] = weakref.WeakKeyDictionary()
        self._parsing = threading.Lock()  # one parse, and one warning, per version

    def fusion(self, channels: ProductChannels) -> StoredFusion:
        """The version's fusion (``FusionModel.stored``): the stored model, or reciprocal rank in its place
        where none was stored or it cannot be parsed (a damaged or hand-edited ``products.json``; a warning
        logged once). Such a version is searched as one with too little text: its channels fused by
        reciprocal rank, without fused match labels. Not refused at load: replicas started after the publish
        would then serve no version of the index at all (every search 503) while older ones kept the
        previous version, and a version whose photos and text still search is better served than none.
        ``ccrk index verify`` names the problem."""
        try:
            return self._models[channels]
        except KeyError:
            pass
        with self._parsing:
            if channels in self._models:
                return self._models[channels]
            stored = FusionModel.stored(channels.info.fusion, stored_languages(channels.info))
            if stored.problem is not None:
                log.warning(
                    "%s: %s; its products are fused by reciprocal rank, without fused match labels",
                    channels.path,
                    stored.problem,
                )
            self._models[channels] = stored
            return stored

    def text(
        self,
        served: Served,
        channels: ProductChannels,
        embed: np.ndarray,
        text: str,
        language: LanguageInfo,
        *,
        mode: str,
        top_k: int,
        offset: int,
        allowed_rows: np.ndarray | None,
        min_score: MinScore,
        sort: SortBy | None,
        explain: bool,
        rerank: Reranker | None = None,
        rerank_k: int = 128,
        cosine_labels: tuple[float, float] | None = None,
        max_per: MaxPer | None = None,
        want_hits: bool = True,
        variants: Sequence[str] = (),
        correction: Correction | None = None,
        rules: ActingRules | None = None,
    ) -> HybridPage:
        """One page of products for a text query. ``rerank`` (a CCRk model, re-ranking on): the head of the
        fused order (``rerank_k`` products) is ordered again by reciprocal-rank fusion of the fused order
        and the fusion encoder's re-rank scores of the products' first photos: the fusion encoder still
        re-ranks on top, without overruling the text channels it cannot see. ``cosine_labels`` (none_below,
        strong_from of the dual encoder's cosine): labels where nothing was calibrated for the fused score
        (image mode, a catalogue with too little text), read on the best photo's cosine. ``max_per``: at most
        n results per value of a field on each page (``service.search.facets.spread``). ``want_hits``
        False: only the relevant rows (``HybridPage.relevant``), for another filter's facet counts.
        ``variants``: the query's synonym variants (``service.search.synonyms``), each read as the query is,
        more readings.
        ``correction``: the query's mistyped words corrected (``service.search.typos``), its terms searched
        at less weight.
        Each reading in a compounding language gets one more where its compound words are split into their
        parts (``service.search.compounds``, where the ranker was given them).
        ``rules``: the merchandising rules acting on the query (``service.search.rules``: pins, hide, boost,
        bury)."""
        start = time.perf_counter()
        stored = self.fusion(channels)
        fusion = stored.model
        lang = language.code if language.code != "und" else None
        certain = is_certain(language)
        analysed = text if correction is None else correction.lexical_text
        readings = [analyze(analysed, lang)] if certain else readings_of(analysed, [lang, *fusion.languages])
        for variant in variants:  # a synonym's match covers the query as the original's would
            more = [analyze(variant, lang)] if certain else readings_of(variant, [lang, *fusion.languages])
            readings += [r for r in more if r and r not in readings]
        if self.compounds is not None and mode != "image":  # a compound covers the query as its parts do
            read_as = [lang] if certain else [lang, *fusion.languages]
            for source in dict.fromkeys([analysed, *variants]):
                more = self.compounds.readings(channels, source, read_as)
                readings += [r for r in more if r not in readings]
        terms = union_of(readings)
        # A stand-in's only group is ``other``, as its explanations say (its languages: what is read for).
        group = OTHER if stored.stand_in else fusion.group_of([lang])
        mask = allowed_mask(served, allowed_rows)
        cands = gather(
            channels,
            HybridQuery(embed, terms, group, readings, {} if correction is None else correction.weights()),
            max(CANDIDATES, offset + top_k),
            mask,
            use_image=mode != "text",
            use_text=mode != "image",
        )
        if rules is not None:  # pinned products no channel found join the candidates
            cands = rules.with_pins(
                channels, cands, embed, mask, use_image=mode != "text", use_text=mode != "image"
            )
        if mode == "image":  # the photos' cosines
            scores, params = cands.features[:, 0].copy(), None
        else:
            scores, params = fusion.score(cands, mode, group), fusion.params(mode, group)
        order = np.argsort(-scores, kind="stable")
        if rules is not None:  # hidden products are no result: not re-ranked, labelled or kept
            order = rules.drop_hidden(cands, order)
        search_s = time.perf_counter() - start
        rerank_scores = np.full(scores.size, np.nan, np.float32)  # per candidate (order may leave some out)
        rerank_s, head = 0.0, 0
        if rerank is not None and mode != "text" and order.size:
            t0 = time.perf_counter()
            head = min(rerank_k, order.size)
            top_rows = order[:head]
            combined = rerank(cands.rows[top_rows], cands.features[top_rows, 0])
            rerank_scores[top_rows] = combined
            by_rerank = np.empty(head, np.int64)
            by_rerank[np.argsort(-combined, kind="stable")] = np.arange(head)
            fused_rrf = 1.0 / (RRF_K + 1.0 + np.arange(head)) + 1.0 / (RRF_K + 1.0 + by_rerank)
            order = np.concatenate([top_rows[np.argsort(-fused_rrf, kind="stable")], order[head:]])
            rerank_s = time.perf_counter() - t0
        if (params is None or params.none_below is None) and cosine_labels is not None and mode != "text":
            params = GroupParams(weights=[], none_below=cosine_labels[0], strong_from=cosine_labels[1])
            quality = cands.features[:, 0].copy()
        else:
            quality = match_scores(cands, params, mode, scores) if params is not None else scores
        top = query_match_score(cands, quality, order, params)
        if not certain and mode != "image" and group != OTHER:
            params, quality, top = self._uncertain_labels(
                fusion, cands, mode, group, order, params, quality, top
            )
        if rules is not None:  # boost and bury, before the cut
            order = rules.reorder(cands, scores, order)
        cut = "weak" if (sort is not None and min_score == "auto") else min_score
        ordered = kept_by_cut(order, quality, scores, params, cut)
        # What facets count: the results the cut keeps, 'auto' counting those not labelled none.
        relevant = ordered if cut != "auto" else kept_by_cut(order, quality, scores, params, "weak")
        if not want_hits:
            return HybridPage([], None, None, time.perf_counter() - start, relevant=cands.rows[relevant])
        chosen = ordered.tolist()
        page = slice(offset, offset + top_k)
        if sort is not None or max_per is not None:  # every kept candidate's metadata
            items = served.items([int(cands.rows[i]) for i in chosen])
            paired = list(zip(chosen, items, strict=True))
            if sort is not None:
                paired = sorted_by_field(paired, sort.field, sort.order)
            if max_per is not None:
                value = {i: item.get(max_per.field) for i, item in paired}
                item_of = dict(paired)
                spread_order = spread([i for i, _ in paired], value.get, max_per, top_k, offset + top_k)
                paired = [(i, item_of[i]) for i in spread_order]
            chosen, items = [p[0] for p in paired][page], [p[1] for p in paired][page]
            if rules is not None and rules.pins:  # pins hold their places in the sorted list too
                chosen = rules.place(cands, [p[0] for p in paired])[page]
                items = served.items([int(cands.rows[i]) for i in chosen])
        elif rules is not None and rules.pins:
            chosen = rules.place(cands, chosen)[page]
            items = served.items([int(cands.rows[i]) for i in chosen])
        else:  # only the page's
            chosen = chosen[page]
            items = served.items([int(cands.rows[i]) for i in chosen])
        hits = self._hits(
            channels,
            cands,
            scores,
            rerank_scores,
            quality,
            chosen,
            items,
            offset,
            params,
            # The version's fusion method (as since it was first written, image mode included); a stand-in's,
            # how the scores were fused: the photos' cosines alone in image mode, reciprocal rank otherwise.
            "none" if stored.stand_in and mode == "image" else fusion.method,
            group,
            explain,
            served.image_base,
        )
        if explain and correction is not None:  # each corrected word's matched form
            for hit in hits:
                if hit.explain is not None:
                    hit.explain.typos = correction.matched(hit.explain.terms)
        if rules is not None:
            rules.mark(hits, [int(cands.rows[i]) for i in chosen])
        label = label_of(top, params) if top is not None else None
        labelled = params if params is not None and params.none_below is not None else None
        return HybridPage(
            hits,
            label,
            labelled,
            search_s,
            rerank_s,
            head,
            top if label is not None else None,
            relevant=cands.rows[relevant],
        )

    @staticmethod
    def _uncertain_labels(
        fusion: FusionModel,
        cands: Candidates,
        mode: str,
        group: str,
        order: np.ndarray,
        params: GroupParams | None,
        quality: np.ndarray,
        top: float | None,
    ) -> tuple[GroupParams | None, np.ndarray, float | None]:
        """The labelling of a query whose language is uncertain and read as one the shop writes in: it may be
        in a language the shop does not write, whose labels were calibrated apart (group ``other``), so it is
        labelled by whichever of the two finds the better match, as it is analysed for each likely language.
        (On the shared grocery catalogue "courgette" and "sojayoghurt", read as English at confidence
        0.13-0.25, were labelled none by the English labels and weak by the others.) The ranking stays the
        detected language's. Only match models' probabilities are compared (one scale; a version without
        them labels by each group's fused score, which another group's thresholds do not read), and only
        between calibrated groups (where the detected one labels nothing, an uncertain query does not either).
        Returns the thresholds, the candidates' match scores and the query's."""
        alt = fusion.params(mode, OTHER)
        if (
            params is None
            or params is not fusion.params(mode, group)  # labels of another kind (the photos' cosines)
            or alt is params
            or top is None
            or not (params.match and alt.match)
            or params.none_below is None
            or alt.none_below is None
        ):
            return params, quality, top
        # Its fused scores are not needed: ``alt`` has a match model (checked above), whose probability
        # match_scores returns without reading them.
        alt_quality = match_scores(cands, alt, mode, quality)
        alt_top = query_match_score(cands, alt_quality, order, alt)
        if alt_top is not None and LABEL_ORDER[label_of(alt_top, alt)] > LABEL_ORDER[label_of(top, params)]:
            return alt, alt_quality, alt_top
        return params, quality, top

    def _hits(
        self,
        channels: ProductChannels,
        cands: Candidates,
        scores: np.ndarray,
        rerank_scores: np.ndarray,
        quality: np.ndarray,
        chosen: list[int],
        items: list[dict[str, Any]],
        offset: int,
        params: GroupParams | None,
        method: str,
        group: str,
        explain: bool,
        image_base: str,
    ) -> list[SearchHit]:
        rows = [int(cands.rows[i]) for i in chosen]
        photos = channels.photo_paths(rows)
        texts = channels.texts_of(
            [int(cands.text[i]) for i in chosen] + [int(cands.lexical[i]) for i in chosen]
        )
        hits = []
        for n, (i, item) in enumerate(zip(chosen, items, strict=True)):
            item_id = item.pop("id")
            item.pop("path", None)
            photo = channels.photo_index_of(int(cands.photo[i])) if cands.photo[i] >= 0 else 0
            count = len(photos.get(rows[n], [])) or 1
            score = float(scores[i])
            hit = SearchHit(
                id=item_id,
                score=score,
                rerank_score=None if np.isnan(rerank_scores[i]) else float(rerank_scores[i]),
                rank=offset + n,
                match=label_of(float(quality[i]), params),
                metadata=item,
                image_url=photo_url(item_id, photo, image_base),
                images=[photo_url(item_id, k, image_base) for k in range(count)],
            )
            if explain:
                dense = texts.get(int(cands.text[i]))
                lexical = texts.get(int(cands.lexical[i]))
                hit.explain = HitExplanation(
                    fused=score,
                    method=method,
                    group=group,
                    channels={
                        name: ChannelScore(
                            score=float(cands.features[i, col]),
                            rank=int(cands.ranks[i, c]) if cands.ranks[i, c] >= 0 else None,
                        )
                        for c, (name, col) in enumerate(zip(CHANNELS, (0, 1, 3), strict=True))
                    },
                    text_field=dense[0] if dense else None,
                    text=dense[2] if dense else None,
                    lexical_field=lexical[0] if lexical else None,
                    terms=cands.matched_terms(i),
                    image_url=photo_url(item_id, photo, image_base),
                    centroid=float(cands.features[i, CENTROID])
                    if channels.text_sum_norms is not None and cands.text[i] >= 0
                    else None,
                    coverage=float(cands.features[i, COVERAGE]) if cands.terms else None,
                )
            hits.append(hit)
        return hits

    @staticmethod
    def visual_rows(
        served: Served,
        channels: ProductChannels,
        query: np.ndarray,
        n: int,
        allowed_rows: np.ndarray | None,
        exclude_row: int | None = None,
    ) -> np.ndarray:
        """The ``n`` products nearest ``query`` by their best photo's visual embedding, best first (what
        ``visual`` pages through)."""
        found = _visual_search(served, channels, query, n, allowed_rows, exclude_row)
        return np.asarray(found.owners, np.int64)

    def visual(
        self,
        served: Served,
        channels: ProductChannels,
        query: np.ndarray,
        *,
        top_k: int,
        offset: int,
        allowed_rows: np.ndarray | None,
        exclude_row: int | None = None,
    ) -> tuple[list[SearchHit], float]:
        """Products by their best photo's visual embedding (search by photo, "more like this")."""
        start = time.perf_counter()
        found = _visual_search(served, channels, query, offset + top_k, allowed_rows, exclude_row)
        search_s = time.perf_counter() - start
        page = slice(offset, offset + top_k)
        rows = found.owners[page].tolist()
        items = served.items(rows)
        photos = channels.photo_paths(rows)
        hits = []
        for n, (row, item) in enumerate(zip(rows, items, strict=True)):
            item_id = item.pop("id")
            item.pop("path", None)
            photo = channels.photo_index_of(int(found.via[page][n]))
            hits.append(
                SearchHit(
                    id=item_id,
                    score=float(found.scores[page][n]),
                    rank=offset + n,
                    metadata=item,
                    image_url=photo_url(item_id, photo, served.image_base),
                    images=[
                        photo_url(item_id, k, served.image_base) for k in range(len(photos.get(row, [])) or 1)
                    ],
                )
            )
        return hits, search_s


def _visual_search(
    served: Served,
    channels: ProductChannels,
    query: np.ndarray,
    n: int,
    allowed_rows: np.ndarray | None,
    exclude_row: int | None,
) -> ChannelHits:
    """The ``n`` best products by their best photo's visual embedding among the live allowed rows, one row
    left out ("more like this" leaves the item itself out)."""
    mask = allowed_mask(served, allowed_rows)
    if exclude_row is not None:
        mask = np.ones(served.index.total_rows, bool) if mask is None else mask.copy()
        mask[exclude_row] = False
    return channels.visual_vectors.search(np.ascontiguousarray(query, np.float32).ravel(), n, mask)
