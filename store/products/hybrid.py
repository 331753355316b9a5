"""Hybrid search over a version's product channels (``store.products.channels``): three channels gather
candidates, each candidate gets features from every channel, and the fusion calibrated at build time
(``FusionModel``) turns the features into one score per product.

Channels of a text query:
1. cross-modal: the query embedding against every photo of a product (best photo wins);
2. dense text: the query embedding against the product's text-field embeddings (best field wins);
3. lexical: BM25 over the analysed text fields (``store.text.lexical_index``), best field wins.

Features of a candidate (the same for fitting and for serving, so a fitted model means what it says):
``image`` and ``text`` the exact best cosine (computed for every candidate, whichever channel found it),
``lexical`` the IDF-weighted share of the query's terms that its best BM25 field holds (0..1; a query read
in several likely languages counts its best-covered reading), ``bm25``
its BM25 score relative to the query's best (0..1), the two 0 for a product BM25 did not find; ``centroid``
the cosine to the normalised sum of the product's text embeddings (every field at once; versions written
before ``text_sum_norms.npy`` lack it, and their fusions, fitted before it, do not read it); ``coverage``
the IDF-weighted share of the query's terms that the product's best-covered text value holds, over every
one of its values, whichever channel found it (what fusions fitted since calibration code 4 read in place
of ``lexical``: "apple juice" read on the best BM25 field alone covered more of the query with the apples'
"Apple" than with Bravo Apple Juice's best-scored field, its Swedish title "Äpple Juice", whose only
English term is "juic"; the juice's English title holds both terms).
(Cosines standardised over each query's candidates were tried as two more features: no better ranking on
the shared grocery catalogue, and match labels far worse.)

Fusion methods (``FusionModel.method``): ``rrf`` (reciprocal-rank fusion, k = 60: nothing fitted),
``weighted`` (a weighted sum of standardised features) and ``logistic`` (the probability of relevance). Each
has parameters per language group: a language the catalogue's text is written in, or ``other`` (lexical
matches are language-bound: a query in a language the shop never wrote in gets the weights fitted for that
case). Nothing here is tuned by hand: ``indexer.fusion_calibration`` fits and chooses them per version.

About 490 lines, kept in one module: the candidates' features, the fusion that reads them and the checks
of a stored fusion's parameters against those features must change together (a feature added in one and
not the others would be read by a model fitted without it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from store.errors import IndexFormatError
from store.products.channels import ProductChannels
from store.products.vectors import ChannelHits, concat_ranges, positions_of

FEATURES = ("image", "text", "lexical", "bm25", "centroid", "coverage")
# The features fusions fitted before the centroid feature read (their parameters name none: ``GroupParams``).
LEGACY_FEATURES = ("image", "text", "lexical", "bm25")
# Each match feature's channel: the list a candidate must be in for the feature to be its own (the fit leaves
# out one that every relevant candidate found there holds at its maximum: indexer.fusion_fitting).
FEATURE_CHANNEL = {"image": "image", "text": "text", "lexical": "lexical", "coverage": "lexical"}
# Each channel's candidates per query: the depth the fusion is calibrated at (indexer.fusion_calibration)
# and served at (more when a page reaches further).
CANDIDATES = 50
CHANNELS = ("image", "text", "lexical")
RRF_K = 60.0
OTHER = "other"
MODES = ("hybrid", "image", "text")


@dataclass
class HybridQuery:
    """A text query as the channels read it: its embedding (D,), its analysed terms (every likely
    language's reading, ``store.text.lexical.analyze_variants``) and the language group of its fusion."""

    embed: np.ndarray
    terms: list[str]
    group: str = OTHER
    # The terms of each reading (one per likely language); none given: ``terms`` is the one reading.
    readings: list[list[str]] = field(default_factory=list)
    # A factor on some terms' BM25 scores and coverage weights (1 for the others): typo-corrected terms
    # weigh less than typed ones, so that a product matching as typed ranks above one matching corrected.
    weights: dict[str, float] = field(default_factory=dict)


@dataclass
class Candidates:
    """Every candidate product of one query, with its features and what matched."""

    rows: np.ndarray  # (n,) int64 product rows
    features: np.ndarray  # (n, len(FEATURES)) float32
    ranks: np.ndarray  # (n, len(CHANNELS)) int64 position in each channel's list, -1 when not in it
    photo: np.ndarray  # (n,) int64 the best photo row (-1: none)
    text: np.ndarray  # (n,) int64 the best dense text row (-1: none)
    lexical: np.ndarray  # (n,) int64 the best BM25 text row (-1: none)
    terms: list[str] = field(default_factory=list)  # the query's terms
    # (n, len(terms)) bool: which terms each candidate's best BM25 text row holds (None: no lexical match)
    term_presence: np.ndarray | None = None
    # each channel's hit scores, best first, in CHANNELS order: what ``tied_ranks`` reads (None: positions)
    channel_scores: tuple[np.ndarray, ...] | None = None

    def __len__(self) -> int:
        return int(self.rows.size)

    def tied_ranks(self) -> np.ndarray:
        """(n, len(CHANNELS)) each candidate's rank in each channel with equal scores sharing one
        (``_tied_ranks``): what reciprocal-rank fusion reads. Computed when asked, not by ``gather``: only
        that method reads them, and a query fused otherwise would pay ~15 us for nothing."""
        if self.channel_scores is None:
            return self.ranks
        return np.stack(
            [_tied_ranks(self.ranks[:, c], scores) for c, scores in enumerate(self.channel_scores)], axis=1
        )

    def matched_terms(self, i: int) -> list[str]:
        """The query terms that candidate ``i``'s best BM25 text value holds (for explanations)."""
        if self.term_presence is None:
            return []
        return [t for t, held in zip(self.terms, self.term_presence[i].tolist(), strict=True) if held]


def _ranks(rows: np.ndarray, hits: ChannelHits) -> np.ndarray:
    """Each candidate row's position in a channel's list (best first, so also its index into the hits), -1
    when not in it."""
    return positions_of(rows, hits.owners)


def _tied_ranks(positions: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Each candidate's rank in a channel: the number of hits that scored strictly higher (equal scores
    share a rank), -1 when not in it. Positions alone order tied hits by row number, which a sharded version
    numbers otherwise: reciprocal-rank fusion then told the same products apart by their rows. (The match
    label's depth check reads positions: a tie reaching past the calibrated depth must not move a label.)"""
    ranks = np.full(positions.shape, -1, np.int64)
    found = positions >= 0
    if found.any():
        descending = -scores.astype(np.float64)  # best first: ascending once negated
        ranks[found] = np.searchsorted(descending, descending[positions[found]], side="left")
    return ranks


def gather(
    channels: ProductChannels,
    query: HybridQuery,
    n: int,
    allowed: np.ndarray | None,
    *,
    use_image: bool = True,
    use_text: bool = True,
    text_mask: np.ndarray | None = None,
    lexical_mask: np.ndarray | None = None,
) -> Candidates:
    """The candidates of the channels in use (each channel's ``n`` best products) with their features.
    ``allowed``: boolean mask over product rows (live and matching the filters); ``text_mask`` and
    ``lexical_mask``: over text rows (calibration leaves fields, or languages, out)."""
    q = np.ascontiguousarray(query.embed, dtype=np.float32).ravel()
    empty = ChannelHits.empty()
    image = channels.photos.search(q, n, allowed) if use_image else empty
    dense = channels.texts.search(q, n, allowed, text_mask) if use_text else empty
    lexical = (
        channels.lexical(query.terms, n, allowed, lexical_mask, query.weights or None) if use_text else empty
    )
    rows = np.unique(np.concatenate([image.owners, dense.owners, lexical.owners]))
    count = rows.size
    features = np.zeros((count, len(FEATURES)), np.float32)
    ranks = np.full((count, len(CHANNELS)), -1, np.int64)
    photo = np.full(count, -1, np.int64)
    text = np.full(count, -1, np.int64)
    lex_rows = np.full(count, -1, np.int64)
    presence = None
    if count == 0:
        return Candidates(rows, features, ranks, photo, text, lex_rows)
    if use_image:
        features[:, 0], photo = channels.photos.best_of(q, rows)
        ranks[:, 0] = _ranks(rows, image)
    if use_text:
        features[:, 1], text, features[:, 4] = channels.texts.best_and_centroid_of(
            q, rows, text_mask, channels.text_sum_norms
        )
        ranks[:, 1] = _ranks(rows, dense)
        idx = _ranks(rows, lexical)
        ranks[:, 2] = idx
        found = np.flatnonzero(idx >= 0)
        if found.size:
            lex_rows[found] = lexical.via[idx[found]]
            best = float(lexical.scores.max()) if lexical.scores.size else 0.0
            features[found, 3] = lexical.scores[idx[found]] / best if best > 0 else 0.0
        features[:, 5], features[:, 2], held = field_coverage(channels, query, rows, lex_rows, lexical_mask)
        presence = held if found.size else None
    # A channel the product has no row in (no text, say) reads as its floor, not as -inf.
    features[~np.isfinite(features)] = -1.0
    scores = (image.scores, dense.scores, lexical.scores)
    return Candidates(rows, features, ranks, photo, text, lex_rows, list(query.terms), presence, scores)


def field_coverage(
    channels: ProductChannels,
    query: HybridQuery,
    products: np.ndarray,
    best_rows: np.ndarray,
    row_mask: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The term coverage of ``products``, (n,) each: ``coverage``, the IDF-weighted share of the query's terms
    that each one's best-covered text value (among ``row_mask``'s) holds, its best-covered reading counted (0
    for a product without a value); ``lexical``, that share at its best BM25 value ``best_rows`` (-1: none,
    0); and (n, len(query.terms)) bool, which of the query's terms that value holds. One presence matrix
    (values x distinct terms) and a product per reading."""
    terms = list(query.terms)
    readings = [r for r in (query.readings or [terms]) if r]
    lo = channels.texts.start[products]
    counts = channels.texts.start[products + 1] - lo
    text_rows, firsts = concat_ranges(lo, counts)
    if row_mask is not None and text_rows.size:
        kept = row_mask[text_rows]
        counts = np.bincount(np.repeat(np.arange(products.size), counts)[kept], minlength=products.size)
        text_rows, firsts = text_rows[kept], np.cumsum(counts) - counts
    coverage = np.zeros(products.size, np.float32)
    lexical = np.zeros(products.size, np.float32)
    presence = np.zeros((products.size, len(terms)), bool)
    if not readings or not text_rows.size:
        return coverage, lexical, presence
    vocab = list(dict.fromkeys([*terms, *(t for r in readings for t in r)]))
    column = {t: j for j, t in enumerate(vocab)}
    idf = channels.term_idf(terms)  # a reading's term beyond the query's cap weighs 0, as in BM25
    present = channels.presence(text_rows, vocab)
    weights = np.zeros((len(vocab), len(readings)), np.float64)
    for k, reading in enumerate(readings):
        for t in reading:
            weights[column[t], k] += idf.get(t, 0.0) * query.weights.get(t, 1.0)
    totals = weights.sum(axis=0)
    totals[totals == 0] = 1.0
    row_coverage = (present @ weights / totals).max(axis=1).astype(np.float32)
    some = np.flatnonzero(counts > 0)
    coverage[some] = np.maximum.reduceat(row_coverage, firsts[some])
    # The best BM25 value is one of the product's values in the mask (the lexical channel read the same).
    at = positions_of(best_rows, text_rows)
    found = at >= 0
    lexical[found] = row_coverage[at[found]]
    presence[found] = present[at[found]][:, [column[t] for t in terms]]
    return coverage, lexical, presence


@dataclass
class GroupParams:
    """One language group's fitted parameters, over the method's feature list."""

    weights: list[float]
    bias: float = 0.0
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)
    none_below: float | None = None  # a match score below this: "none"
    strong_from: float | None = None  # from this on: "strong"
    # The match model: logistic weights over ``match_features`` (mode text: without the image) and its bias
    # last; its probability is the match score labels read. Empty: labels read the fused score.
    match: list[float] = field(default_factory=list)
    # The names of the features ``weights`` and ``match`` are over; empty (fitted before the centroid
    # feature): ``LEGACY_FEATURES`` and ``MATCH_FEATURES`` (``feature_columns``, ``match_columns``).
    features: list[str] = field(default_factory=list)
    match_features: list[str] = field(default_factory=list)
    # What a query's label reads: "top", the top-ranked candidate's match score (fits before the centroid
    # feature), or "any", the best match score of its candidates (whether the shop holds a match, however
    # the fusion orders the results, and on or off the page; ``query_match_score``,
    # ``indexer.fusion_fitting.fit_match`` fits the model for it).
    match_over: str = "top"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class FusionModel:
    """The fusion of one version: ``method`` and the parameters of each language group, for hybrid and for
    text-only search. ``languages`` maps the catalogue's text languages to their group."""

    method: str
    hybrid: dict[str, GroupParams]
    text: dict[str, GroupParams]
    languages: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "languages": list(self.languages),
            "hybrid": {g: p.to_dict() for g, p in self.hybrid.items()},
            "text": {g: p.to_dict() for g, p in self.text.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FusionModel:
        """The model ``to_dict`` wrote (``products.json``'s ``fusion``), checked: IndexFormatError for
        anything a search would fail on (a hand-edited or damaged file): a value of the wrong type, a number
        that is not finite or that no float holds, a mode without an ``other`` group, a group's parameters
        that name an unknown feature or do not fit the features they name."""
        try:
            if not isinstance(data, dict):
                raise TypeError(f"a {type(data).__name__}, not an object")
            model = cls(
                method=str(data["method"]),
                hybrid={g: GroupParams(**p) for g, p in data.get("hybrid", {}).items()},
                text={g: GroupParams(**p) for g, p in data.get("text", {}).items()},
                languages=list(data.get("languages", [])),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise IndexFormatError(f"products.json: unreadable fusion: {exc!r}") from None
        if not all(isinstance(lang, str) for lang in model.languages):
            raise IndexFormatError(f"products.json: fusion languages {model.languages!r} are not all names")
        for mode, table in (("hybrid", model.hybrid), ("text", model.text)):
            if OTHER not in table:  # what ``params`` falls back to for any group
                raise IndexFormatError(f"products.json: fusion {mode} has no {OTHER!r} group")
            for group, params in table.items():
                problem = _types_problem(params) or _params_problem(model.method, params, mode)
                if problem:
                    raise IndexFormatError(f"products.json: fusion {mode}/{group}: {problem}")
        return model

    @classmethod
    def reciprocal_rank(cls, languages: Sequence[str] = ()) -> FusionModel:
        """Reciprocal-rank fusion, nothing fitted: one ``other`` group without weights or match model, so no
        fused match labels. What a build with too little text to calibrate on stores
        (``indexer.fusion_calibration``), and what a search uses in place of a stored fusion that is missing
        or cannot be parsed (``stored``); ``languages``: the catalogue's, as an uncertain query is read."""
        params = {OTHER: GroupParams(weights=[])}
        return cls("rrf", params, dict(params), list(languages))

    @classmethod
    def stored(cls, data: Any, languages_fallback: Sequence[str] = ()) -> StoredFusion:
        """The fusion a version's searches use, from what its ``products.json`` stores: the stored model, or
        where there is none (nothing calibrated) or it cannot be parsed, ``reciprocal_rank`` over
        ``languages_fallback`` with the problem named. Not refused: a version whose photos and text still
        search is better served than none (``service.search.hybrid.HybridRanker.fusion``), and ``ccrk index
        verify`` names the problem (``store.verify``)."""
        if not data:
            return StoredFusion(cls.reciprocal_rank(languages_fallback), stand_in=True)
        try:
            return StoredFusion(cls.from_dict(data))
        except IndexFormatError as exc:
            return StoredFusion(cls.reciprocal_rank(languages_fallback), str(exc), stand_in=True)

    def group_of(self, languages: Sequence[str | None]) -> str:
        """The group of a query read as ``languages`` (most likely first): the first of them the catalogue
        is written in, else ``other``."""
        for lang in languages:
            if lang in self.languages:
                return str(lang)
        return OTHER

    def params(self, mode: str, group: str) -> GroupParams:
        table = self.text if mode == "text" else self.hybrid
        return table.get(group) or table[OTHER]

    def score(self, candidates: Candidates, mode: str, group: str) -> np.ndarray:
        """The fused score of every candidate (higher is better)."""
        return fuse(self.method, candidates, self.params(mode, group), mode)


@dataclass(frozen=True)
class StoredFusion:
    """A version's fusion as searched (``FusionModel.stored``)."""

    model: FusionModel
    problem: str | None = None  # why the stored model is not used: it cannot be parsed (None: no problem)
    stand_in: bool = False  # ``model`` is reciprocal rank in place of a missing or unparseable stored one


MATCH_FEATURES = ("image", "text", "lexical")  # raw, comparable across queries (no per-query scaling)


def is_finite_number(value: Any) -> bool:
    """A finite number a float64 holds. JSON reads NaN and Infinity, and a long integer as an int no float
    holds: fusing raised OverflowError (``np.asarray(..., np.float64)``) or scored NaN, and a NaN threshold
    failed the answer's ``MatchThresholdsInfo``, a 500 at every search of the version. Not a bool (JSON's
    true/false): a threshold of false read as 0 labelled every answer strong. Match thresholds are checked
    by it too (``indexer.match_calibration.MatchThresholds.from_dict``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond a float's range
        return False


def _types_problem(params: GroupParams) -> str | None:
    """A group's stored value not of its field's type, or a number that is not finite (None: none), which a
    search would fail on."""
    for name in ("weights", "mean", "std", "match"):
        values = getattr(params, name)
        if not isinstance(values, list) or not all(is_finite_number(v) for v in values):
            return f"{name} {values!r:.120} is not a list of numbers (finite, as a float holds them)"
    for name in ("features", "match_features"):
        values = getattr(params, name)
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return f"{name} {values!r} is not a list of names"
    if not is_finite_number(params.bias):
        return f"bias {params.bias!r:.120} is not a number (finite, as a float holds it)"
    for name in ("none_below", "strong_from"):
        value = getattr(params, name)
        if value is not None and not is_finite_number(value):
            return f"{name} {value!r:.120} is not a number (finite, as a float holds it)"
    if not isinstance(params.match_over, str):
        return f"match_over {params.match_over!r} is not a name"
    return None


def _params_problem(method: str, params: GroupParams, mode: str) -> str | None:
    """What makes a group's stored parameters unusable (None: nothing)."""
    unknown = [n for n in (*params.features, *params.match_features) if n not in FEATURES]
    if unknown:
        return f"unknown features {unknown}"
    if params.match_over not in ("top", "any"):
        return f"match_over {params.match_over!r} is neither 'top' nor 'any'"
    width = len(feature_columns(mode, params))
    if method != "rrf" and len(params.weights) != width:
        return f"{len(params.weights)} weights for {width} features"
    if params.mean and not len(params.mean) == len(params.std) == width:
        return f"mean/std of {len(params.mean)}/{len(params.std)} values for {width} features"
    if any(s <= 0 for s in params.std):  # features are divided by it: inf or NaN scores (fits keep it > 1e-6)
        return f"std {params.std!r:.120} is not all positive"
    if params.match and len(params.match) != len(match_columns(mode, params)) + 1:
        return f"{len(params.match)} match weights for {len(match_columns(mode, params))} features and a bias"
    return None


def mode_features(names: Sequence[str], mode: str) -> list[str]:
    """``names`` as a mode reads them: mode text leaves the image out."""
    return [n for n in names if n != "image"] if mode == "text" else list(names)


def columns_of(names: Sequence[str], mode: str) -> list[int]:
    """The columns of ``Candidates.features`` holding ``names``, as ``mode`` reads them."""
    return [FEATURES.index(n) for n in mode_features(names, mode)]


def feature_columns(mode: str, params: GroupParams | None = None) -> list[int]:
    """The columns a fusion reads: those its parameters name (fitted before the centroid feature:
    ``LEGACY_FEATURES``), as ``mode`` reads them."""
    return columns_of(params.features if params is not None and params.features else LEGACY_FEATURES, mode)


def match_columns(mode: str, params: GroupParams | None = None) -> list[int]:
    names = params.match_features if params is not None and params.match_features else MATCH_FEATURES
    return columns_of(names, mode)


def query_match_score(
    candidates: Candidates, quality: np.ndarray, order: np.ndarray, params: GroupParams | None
) -> float | None:
    """The match score a query's label reads (``GroupParams.match_over``): its top-ranked candidate's, or
    the best of any candidate's among each channel's first ``CANDIDATES`` (the depth it was calibrated at,
    so that a page reaching further, which gathers more, does not move it); None without candidates. Only
    the candidates of ``order`` count (a caller may have left some out: merchandising rules' hidden ones)."""
    if not order.size:
        return None
    if params is not None and params.match_over == "any" and params.match:
        within = ((candidates.ranks >= 0) & (candidates.ranks < CANDIDATES)).any(axis=1)
        if order.size < within.size:
            listed = np.zeros(within.size, bool)
            listed[order] = True
            within &= listed
        return float(quality[within].max()) if within.any() else float(quality[order[0]])
    return float(quality[order[0]])


def match_scores(candidates: Candidates, params: GroupParams, mode: str, fused: np.ndarray) -> np.ndarray:
    """What match labels read: the match model's probability that a candidate is a real match, or the fused
    score where a version has no match model."""
    if not params.match:
        return fused
    x = candidates.features[:, match_columns(mode, params)].astype(np.float64)
    w = np.asarray(params.match, np.float64)
    return (1.0 / (1.0 + np.exp(-(x @ w[:-1] + w[-1])))).astype(np.float32)


def channel_columns(mode: str) -> list[int]:
    return [1, 2] if mode == "text" else [0, 1, 2]


def rrf(candidates: Candidates, mode: str) -> np.ndarray:
    ranks = candidates.tied_ranks()[:, channel_columns(mode)]
    return np.where(ranks >= 0, 1.0 / (RRF_K + ranks + 1.0), 0.0).sum(axis=1).astype(np.float32)


def fuse(method: str, candidates: Candidates, params: GroupParams, mode: str) -> np.ndarray:
    if method == "rrf":
        return rrf(candidates, mode)
    x = candidates.features[:, feature_columns(mode, params)].astype(np.float64)
    if params.mean:
        x = (x - np.asarray(params.mean)) / np.asarray(params.std)
    z = x @ np.asarray(params.weights, np.float64) + params.bias
    if method == "logistic":
        return (1.0 / (1.0 + np.exp(-z))).astype(np.float32)
    return z.astype(np.float32)
