"""Request and response models of the HTTP API (pydantic; they are the OpenAPI schema)."""

from __future__ import annotations

import itertools
import math
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError

MAX_TOP_K = 200
MAX_RERANK_K = 512
MAX_OFFSET = 1000
MAX_QUERY_CHARS = 512

# SQLite's INTEGER range: a filter value beyond it cannot be bound (OverflowError inside the query).
SQLITE_INT_MIN, SQLITE_INT_MAX = -(2**63), 2**63 - 1


def _valid_unicode(text: str) -> str:
    """Refuse lone surrogates: JSON's \\ud800 escape decodes to one, which no UTF-8 consumer (the tokenizer,
    SQLite, the response encoder) can take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode: a lone surrogate at position {exc.start}") from None
    return text


def _finite_scalar(value: object) -> object:
    """A filter value SQLite can compare: integers within its INTEGER range, finite numbers."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not SQLITE_INT_MIN <= value <= SQLITE_INT_MAX:
            raise ValueError("integers must lie within -2**63 .. 2**63 - 1")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError("numbers must be finite (no NaN or Infinity)")
    return value


UnicodeText = Annotated[str, AfterValidator(_valid_unicode)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
# A language hint: an ISO 639 code, optionally with a region or script ("en", "pt-BR", "zh_Hans").
LangCode = Annotated[str, StringConstraints(pattern=r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*$", max_length=32)]
QueryText = Annotated[UnicodeText, StringConstraints(min_length=1, max_length=MAX_QUERY_CHARS)]
FieldName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")]
MAX_FILTER_CHARS = 256
Scalar = Annotated[
    Annotated[UnicodeText, StringConstraints(max_length=MAX_FILTER_CHARS)] | int | float | bool,
    BeforeValidator(_finite_scalar),
]


class RangeFilter(BaseModel):
    """A numeric range; at least one bound."""

    model_config = ConfigDict(extra="forbid")
    gte: FiniteFloat | None = None
    gt: FiniteFloat | None = None
    lte: FiniteFloat | None = None
    lt: FiniteFloat | None = None

    @model_validator(mode="after")
    def _one_bound(self) -> RangeFilter:
        if self.gte is None and self.gt is None and self.lte is None and self.lt is None:
            raise ValueError("a range needs at least one of gte, gt, lte, lt")
        return self


MatchLabel = Literal["strong", "weak", "none"]
# "auto": label only; "weak": drop hits labelled none; "strong": strong hits only; a number: a cosine floor.
MinScore = Literal["auto", "weak", "strong"] | Annotated[float, Field(ge=-1.0, le=1.0, allow_inf_nan=False)]


_SCALAR: TypeAdapter[Any] = TypeAdapter(Scalar)
_RANGE: TypeAdapter[RangeFilter] = TypeAdapter(RangeFilter)


def _scalar_problem(value: object) -> str | None:
    """Why ``value`` is not a filter scalar, in the words of the check it failed (not one line per member
    of the union); None when it is one."""
    if isinstance(value, str) and len(value) > MAX_FILTER_CHARS:
        return f"a string of {len(value)} characters; at most {MAX_FILTER_CHARS} are taken"
    try:
        _SCALAR.validate_python(value)
    except ValidationError as exc:
        specific = [e for e in exc.errors() if not e["type"].endswith(("_type", "_parsing", "_from_float"))]
        if specific:
            return str(specific[0]["msg"]).removeprefix("Value error, ")
        kind = "null" if value is None else "a list" if isinstance(value, list) else "an object"
        return f"{kind} is not a string, number or boolean"
    return None


def _filter_value_problem(value: object) -> str:
    """Why ``value`` is not a filter value, judged by the one shape its JSON type can take: an object is a
    range, an array a list of scalars, anything else a scalar."""
    if isinstance(value, dict):
        try:
            _RANGE.validate_python(value)
        except ValidationError as exc:
            return "; ".join(
                f"range {'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else f"range: {e['msg']}"
                for e in exc.errors(include_url=False)[:3]
            ).replace("Value error, ", "")
    elif isinstance(value, list):
        if not 1 <= len(value) <= 100:
            return f"a list of {len(value)} values; a list takes 1 to 100"
        for n, item in enumerate(value):
            if problem := _scalar_problem(item):
                return f"item {n}: {problem}"
    elif value is None:
        return (
            "null is not a filter: a string, number or boolean, a list of them, or a range {gte, gt, lte, lt}"
        )
    elif problem := _scalar_problem(value):
        return problem
    return "not a filter"  # every shape's own check passed: the union refused it for another reason


def _one_filter_error(value: object, handler: ValidatorFunctionWrapHandler) -> object:
    """A filter value's 422 is one error at the filter's own place saying what is wrong, not pydantic's
    error per member of the union, whose places name its validator functions (memory addresses
    included)."""
    try:
        return handler(value)
    except ValidationError:
        raise PydanticCustomError("filter_value", _filter_value_problem(value)) from None


# equality (scalar), any-of (list of scalars), or numeric range
FilterValue = Annotated[
    Scalar | Annotated[list[Scalar], Field(min_length=1, max_length=100)] | RangeFilter,
    WrapValidator(_one_filter_error),
]
Filters = Annotated[dict[FieldName, FilterValue], Field(max_length=16)]


SearchMode = Literal["hybrid", "image", "text"]


class SortBy(BaseModel):
    """Relevant results ordered by a metadata field (after the ``min_score`` cut)."""

    model_config = ConfigDict(extra="forbid")
    field: FieldName = Field(description="A metadata field, e.g. price.")
    order: Literal["asc", "desc"] = "asc"


MAX_FACETS = 10  # faceted fields per request
MAX_FACET_SIZE = 100  # values listed per field
MAX_FACET_RANGES = 50  # ranges per numeric field
MAX_FACET_VALUE_CHARS = 256  # a counted text value (a category, a brand; not a description)
RangeBound = FiniteFloat | None


def _facet_of_name(value: object) -> object:
    """``"brand"`` is short for ``{"field": "brand"}``."""
    return {"field": value} if isinstance(value, str) else value


class FacetSpec(BaseModel):
    """One faceted field: its top values with their counts, its numeric min/max, and counts per range."""

    model_config = ConfigDict(extra="forbid")
    field: FieldName = Field(description="A metadata field, e.g. category, brand, price.")
    size: int = Field(10, ge=1, le=MAX_FACET_SIZE, description="How many of its values to list (most first).")
    ranges: (
        Annotated[
            list[Annotated[list[RangeBound], Field(min_length=2, max_length=2)]],
            Field(min_length=1, max_length=MAX_FACET_RANGES),
        ]
        | None
    ) = Field(
        None,
        description="Numeric ranges [from, to) to count, e.g. [[null, 5], [5, 20], [20, null]]: from "
        "inclusive, to exclusive, null open; they may not overlap.",
    )

    @model_validator(mode="after")
    def _ranges_apart(self) -> FacetSpec:
        if not self.ranges:
            return self
        spans = []
        for n, (low, high) in enumerate(self.ranges):
            if low is None and high is None:
                raise ValueError(f"range {n} has no bound; give from, to or both")
            if low is not None and high is not None and not low < high:
                raise ValueError(f"range {n} [{low}, {high}) is empty: from must be below to")
            spans.append((-math.inf if low is None else low, math.inf if high is None else high, n))
        spans.sort()
        for (_, high, a), (low, _, b) in itertools.pairwise(spans):
            if low < high:
                raise ValueError(f"ranges {a} and {b} overlap; each value is counted in one range at most")
        return self


FacetRequest = Annotated[FacetSpec, BeforeValidator(_facet_of_name)]


def _distinct_facets(facets: list[FacetSpec] | None) -> list[FacetSpec] | None:
    if facets:
        seen: set[str] = set()
        for spec in facets:
            if spec.field in seen:
                raise ValueError(f"field {spec.field!r} is faceted twice")
            seen.add(spec.field)
    return facets


Facets = Annotated[
    Annotated[list[FacetRequest], Field(max_length=MAX_FACETS)] | None, AfterValidator(_distinct_facets)
]
FACETS_DESCRIPTION = (
    'Facet counts beside the hits: ["category", "brand", {"field": "price", "ranges": [[null, 5], [5, 20], '
    "[20, null]]}]. Counted over every relevant result (those the min_score cut keeps; with 'auto', those "
    "not labelled none), not only the page; a filter on a faceted field does not narrow that field's own "
    f"counts. At most {MAX_FACETS} fields, {MAX_FACET_SIZE} values and {MAX_FACET_RANGES} ranges each."
)


class MaxPer(BaseModel):
    """At most ``n`` results with the same value of ``field`` on each page (the rest move to later pages)."""

    model_config = ConfigDict(extra="forbid")
    field: FieldName = Field(description="A metadata field, e.g. brand.")
    n: int = Field(ge=1, le=MAX_TOP_K, description="Results per value on one page.")


MAX_PER_DESCRIPTION = (
    'Diversity: {"field": "brand", "n": 2} puts at most n results with one value of the field on each page '
    "of top_k (pages counted from the first result); the others move down to later pages, in order. Results "
    "without the field are not capped."
)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: QueryText = Field(description="The shopper's query, any language.")
    lang: LangCode | None = Field(None, description="Language hint; overrides detection.")
    top_k: int = Field(20, ge=1, le=MAX_TOP_K)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)
    rerank: bool | None = Field(None, description="Re-rank with the fusion encoder; server default if unset.")
    rerank_k: int = Field(128, ge=1, le=MAX_RERANK_K, description="Candidates the fusion encoder re-ranks.")
    filters: Filters | None = Field(
        None,
        description='Metadata filters: {"field": value} equality, {"field": [v1, v2]} any-of, '
        '{"field": {"gte": x, "lte": y}} numeric range (also gt, lt).',
    )
    min_score: MinScore = Field(
        "auto",
        description="Which results to keep by match quality: 'auto' keeps all and labels them (calibrated "
        "per index and language), 'weak' drops results labelled 'none', 'strong' keeps strong ones only, "
        "a number keeps results whose cosine score is at least that.",
    )
    mode: SearchMode | None = Field(
        None,
        description="What a text query searches: 'hybrid' (the products' photos, their text fields' "
        "embeddings and BM25, fused as calibrated for this index and language), 'image' (photos only), "
        "'text' (text fields only). Default: hybrid where the index has searched text fields, else image.",
    )
    explain: bool = Field(
        False,
        description="Per hit, each channel's score and rank, the matched text field and terms, and the "
        "matched image (hybrid and text modes).",
    )
    sort: SortBy | None = Field(
        None,
        description="Order the relevant results by a metadata field, e.g. "
        '{"field": "price", "order": "asc"}: applied after the min_score cut; with min_score '
        "'auto', results labelled 'none' are dropped first. Items without the field come last.",
    )
    facets: Facets = Field(None, description=FACETS_DESCRIPTION)
    max_per: MaxPer | None = Field(None, description=MAX_PER_DESCRIPTION)
    typos: Annotated[int, Field(ge=0, le=2, strict=True)] | None = Field(
        None,
        description="Typo tolerance on a product index: the most edits a query word the catalogue never "
        "writes is corrected by (one for words of 5-8 letters, two from 9 letters, at most this); 0 turns "
        "it off. Default: 2. The corrected query is answered as corrected_query.",
    )
    synonyms: bool = Field(
        True,
        description="Whether the index's synonyms expand the query (see expanded); false: the query as typed "
        "(what a shop checks before writing a synonym: search analytics' top 'none' queries link to both).",
    )


class LanguageInfo(BaseModel):
    code: str = Field(description="ISO 639 code, or 'und' when nothing could be told.")
    confidence: float = Field(ge=0.0, le=1.0)
    source: Literal["hint", "detected"]
    supported: bool = Field(description="Whether the model was trained for this language.")
    mixed: bool = Field(False, description="The query seems to mix languages or scripts.")


class ChannelScore(BaseModel):
    score: float
    rank: int | None = Field(description="0-based rank in the channel's own list; null when not in it.")


class HitExplanation(BaseModel):
    fused: float = Field(description="The fused score.")
    method: str = Field(description="The fusion calibrated for this index: rrf, weighted or logistic.")
    group: str = Field(description="The language group whose fusion parameters were used.")
    channels: dict[str, ChannelScore] = Field(
        description="image (best photo cosine), text (best text-field cosine), lexical (BM25, when found)."
    )
    text_field: str | None = Field(None, description="The text field that matched best (dense text).")
    text: str | None = Field(None, description="Its text.")
    lexical_field: str | None = Field(None, description="The text field BM25 matched.")
    terms: list[str] = Field(default_factory=list, description="The query's terms found in it.")
    typos: dict[str, str] = Field(
        default_factory=dict,
        description="Query words matched only as corrected: {typed word: the catalogue's word}, and "
        "words corrected from the query language's dictionary (the catalogue does not hold them: every "
        "hit's dense channels were scored with them) as {typed word: the dictionary's word}.",
    )
    centroid: float | None = Field(
        None,
        description="The query's cosine to the normalised sum of the product's text-field embeddings (every "
        "field at once, a fusion feature); null without text, or in an index written before it.",
    )
    coverage: float | None = Field(
        None,
        description="The IDF-weighted share of the query's terms that the product's best-covered text value "
        "holds (0..1, every field looked at; a fusion feature); null for a query without terms.",
    )
    image_url: str | None = Field(None, description="The photo that matched best.")
    rules: list[str] = Field(
        default_factory=list, description="The merchandising rules that acted on this hit (pin, boost, bury)."
    )


class SearchHit(BaseModel):
    id: str
    score: float = Field(
        description="Dual-encoder cosine similarity; in hybrid and text modes the fused score."
    )
    rerank_score: float | None = Field(
        None, description="Re-ranking score (similarity / temperature + match log-odds), when re-ranked."
    )
    rank: int = Field(description="0-based rank in the full result list (offset included).")
    match: MatchLabel | None = Field(
        None,
        description="How good a match this result is (calibrated on the index): strong, weak or none. Null "
        "on image-search and similar-items hits: a version calibrates text queries against its photos, and "
        "a photo's cosine to other photos lies on another scale (demo model: the nearest other product's "
        "photo scores 0.92 at the median, above the text queries' 'strong' threshold whether or not it "
        "shows the same thing), so no calibrated label exists for it.",
    )
    metadata: dict[str, Any]
    image_url: str = Field(description="The item's image: for a product, the photo that matched best.")
    images: list[str] | None = Field(None, description="All photos of a product, first photo first.")
    explain: HitExplanation | None = None
    pinned: bool = Field(False, description="Placed by a merchandising rule's pin (products search).")


class Timings(BaseModel):
    encode: float
    search: float
    rerank: float
    total: float


class MatchThresholdsInfo(BaseModel):
    none_below: float = Field(description="A score below this is 'none' (no good match).")
    strong_from: float | None = Field(
        description="A score from this on is 'strong'; between them 'weak'. None: nothing is labelled strong."
    )


class FacetValueCount(BaseModel):
    value: str | int | float | bool
    count: int = Field(description="Relevant results holding this value (a list field: any of its items).")


class FacetRangeCount(BaseModel):
    gte: float | None = Field(description="From (inclusive); null: open. As a filter: {gte, lt}.")
    lt: float | None = Field(description="To (exclusive); null: open.")
    count: int


class FacetResult(BaseModel):
    field: str
    values: list[FacetValueCount] = Field(
        description="The most frequent values, most first (ties in the order the ranking met them)."
    )
    distinct: int = Field(
        description="Distinct values among the relevant results (values lists the top size)."
    )
    missing: int = Field(description="Relevant results without a countable value of this field.")
    min: float | None = Field(None, description="The least numeric value (null: none is numeric).")
    max: float | None = Field(None, description="The greatest numeric value.")
    ranges: list[FacetRangeCount] | None = Field(
        None, description="Counts per requested range, in its order."
    )
    relevant: int = Field(
        description="Relevant results counted: the query's, or with a filter on this very field, the query's "
        "without that filter (disjunctive facets)."
    )


QUERY_ID_DESCRIPTION = (
    "This search's id in the index's query log (search analytics): send it with the shopper's clicks, adds "
    "to cart and purchases (POST /v1/events). Null where CCRK_ANALYTICS is off."
)


class SearchResponse(BaseModel):
    results: list[SearchHit]
    mode: SearchMode = Field("image", description="What was searched.")
    language: LanguageInfo
    index_version: str
    model: str
    reranked: bool
    timings_ms: Timings
    cached: bool
    match: MatchLabel | None = Field(
        None,
        description="The query's match quality: its best result's label, or on a product index calibrated "
        "since 27 Nov 2026 the best label among its candidates (whether the shop holds a match, which may "
        "rank below the page): 'none' tells a front end that nothing in the catalogue matches well (the "
        "results are still returned unless min_score drops them).",
    )
    match_thresholds: MatchThresholdsInfo | None = Field(
        None, description="The thresholds used for this query's language."
    )
    match_score: float | None = Field(
        None,
        description="The score the query's label was read from, on the scale of match_thresholds: the top "
        "result's cosine; on a product index, the match probability of its best candidate (of its top-ranked "
        "one on versions calibrated before 27 Nov 2026; its fused score on versions without a match model; "
        "the top-ranked product's photo cosine where labels fall back to the photos'). A front end may draw "
        "its own line on it. None where nothing was labelled.",
    )
    facets: list[FacetResult] | None = Field(None, description="The requested facets, in request order.")
    expanded: list[str] = Field(
        default_factory=list,
        description="The query's synonym variants searched beside it (the index's synonyms, per language; "
        "empty when none applied).",
    )
    corrected_query: str | None = Field(
        None,
        description="The query as searched where typo tolerance corrected some of its words (see typos): "
        "a front end may say 'showing results for ...'. None where nothing was corrected.",
    )
    query_id: str | None = Field(None, description=QUERY_ID_DESCRIPTION)


class SimilarRequest(BaseModel):
    """More like an indexed item: its stored photo vectors are the query (no upload)."""

    model_config = ConfigDict(extra="forbid")
    top_k: int = Field(20, ge=1, le=MAX_TOP_K)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)
    filters: Filters | None = None
    include_self: bool = Field(False, description="Keep the item itself in the results.")
    facets: Facets = Field(
        None,
        description="Facet counts over the first max(50, offset + top_k) similar products (photo similarity "
        "has no calibrated cut); otherwise as in /v1/search.",
    )
    max_per: MaxPer | None = Field(None, description=MAX_PER_DESCRIPTION)


class ImageSearchResponse(BaseModel):
    results: list[SearchHit]
    index_version: str
    model: str
    timings_ms: Timings
    facets: list[FacetResult] | None = None
    query_id: str | None = Field(None, description=QUERY_ID_DESCRIPTION)


class ConsistencyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    queries: Annotated[dict[LangCode, QueryText], Field(min_length=2, max_length=20)] = Field(
        description="The same intent in 2-20 languages: {lang: text}."
    )
    top_k: int = Field(10, ge=1, le=MAX_TOP_K)
    rerank: bool | None = None
    filters: Filters | None = None
    mode: SearchMode | None = Field(
        None,
        description="What each language's query searches (see /v1/search): compare hybrid with image to see "
        "what lexical matching, which is bound to a language, costs in consistency.",
    )


class LanguageResults(BaseModel):
    lang: str
    query: str
    ids: list[str]
    language: LanguageInfo


class ItemRanks(BaseModel):
    id: str
    ranks: dict[str, int] = Field(description="0-based rank per language; top_k when absent from a list.")
    variance: float = Field(description="Population variance of the ranks.")


class PairStats(BaseModel):
    a: str
    b: str
    overlap: float = Field(description="|A ∩ B| / top_k.")
    kendall_tau: float | None = Field(
        description="Kendall tau-b over the union of both lists; null if constant."
    )


class ConsistencyResponse(BaseModel):
    top_k: int
    mode: SearchMode = Field("image", description="What was searched.")
    index_version: str
    model: str
    languages: list[LanguageResults]
    items: list[ItemRanks]
    mrv: float = Field(description="Mean Rank Variance (CCRk eq. 7) over the union, squared rank units.")
    mrv_std: float = Field(description="Mean per-item standard deviation of the ranks, rank units.")
    mean_overlap: float = Field(description="Mean pairwise overlap@k.")
    pairs: list[PairStats]


class IndexInfo(BaseModel):
    name: str
    version: str
    created_at: str
    model_name: str
    model_fingerprint: str
    embed_dim: int
    count: int
    index_factory: str
    search_params: dict[str, Any]
    measured_recall_at_10: float | None
    rerank: dict[str, Any]
    loaded_at: str


class LanguageSupport(BaseModel):
    code: str
    recall_at_10: float | None = Field(description="Text->image recall@10 measured at index build time.")


class ModelInfo(BaseModel):
    name: str = Field(description="The model directory's name.")
    fingerprint: str = Field(description="sha256 of the model's config and weights; indexes record it.")
    architecture: str = Field(description="'ccrk' (dual + fusion encoder) or 'conse' (the starter model).")
    embed_dim: int
    languages: list[str] = Field(description="Languages the model was trained for.")
    rerank: bool = Field(description="Whether the model has a fusion encoder, i.e. can re-rank.")
    rerank_default: bool = Field(description="Whether searches re-rank when a request does not say.")
    backend: str
    device: str


class LanguagesResponse(BaseModel):
    model: str
    languages: list[LanguageSupport]


class Status(BaseModel):
    status: str
    index_version: str | None = None
    detail: str | None = None
    pid: int | None = Field(None, description="The server process that answered (`ccrk serve --workers N`).")


class Readiness(Status):
    indexes: dict[str, str | None] | None = Field(
        None,
        description="A process serving several indexes: each one's served version (null while it has none).",
    )
    change_logs: dict[str, str] | None = Field(
        None,
        description="Served indexes whose change log cannot be read now, and why: their searches answer from"
        " the product writes already applied, and writes get 503 (null: every log reads).",
    )
    change_notices: str | None = Field(
        None,
        description="With the change log in PostgreSQL: why this process cannot LISTEN for its NOTIFY now"
        " (it still shows every write, at its CCRK_LIVE_POLL_S poll); null while it listens, or without"
        " PostgreSQL.",
    )


class ReloadResponse(BaseModel):
    previous_version: str | None
    version: str
    changed: bool
