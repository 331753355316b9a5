"""Match labels of a hybrid query whose language is uncertain (``service.search.hybrid.HybridRanker.text``):
read as a language the shop writes in at a detection confidence under ``CONFIDENT``, a query is labelled by
whichever of its group's and the ``other`` group's match models finds the better match; a hinted or certain
language, image mode's cosine labels, an uncalibrated group and a version without match models keep their
own labels. The channels are stubbed (``gather`` returns fixed candidates): what is checked is labelling."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from service.schemas import LanguageInfo
from service.search import hybrid
from store.products.hybrid import FEATURES, MATCH_FEATURES, OTHER, Candidates, FusionModel, GroupParams
from tests.store.test_products import MALFORMED_FUSIONS
from tests.store.test_stored_fusion import NOT_FINITE_FUSIONS

N = 4
UNSURE = LanguageInfo(code="en", confidence=0.2, source="detected", supported=True)
SURE = LanguageInfo(code="en", confidence=0.95, source="detected", supported=True)
HINTED = LanguageInfo(code="en", confidence=1.0, source="hint", supported=True)
FOREIGN = LanguageInfo(code="fr", confidence=0.2, source="detected", supported=True)


def _params(bias: float | None, *, text: bool = False, none_below: float | None = 0.5) -> GroupParams:
    """A group whose match model ignores the features: every candidate's probability is sigmoid(bias);
    ``bias`` None: no match model (labels read the fused score, as versions fitted before match models)."""
    match_features = [f for f in MATCH_FEATURES if not (text and f == "image")]
    return GroupParams(
        weights=[0.2] * (len(FEATURES) - (1 if text else 0)),
        none_below=none_below,
        strong_from=0.8,
        match=[] if bias is None else [0.0] * len(match_features) + [bias],
        features=list(FEATURES),
        match_features=list(MATCH_FEATURES),
        match_over="any",
    )


def _fusion(
    english: float | None, other: float | None, *, english_none_below: float | None = 0.5
) -> FusionModel:
    return FusionModel(
        "weighted",
        {"en": _params(english, none_below=english_none_below), OTHER: _params(other)},
        {"en": _params(english, text=True, none_below=english_none_below), OTHER: _params(other, text=True)},
        ["en"],
    )


class _Channels(SimpleNamespace):
    __hash__ = object.__hash__  # the ranker keeps each version's fusion model by its channels (weakly)
    __eq__ = object.__eq__


def _channels(stored: Any) -> _Channels:
    """A version's channels stubbed: ``stored`` its products.json's fusion."""
    return _Channels(
        path="shop/v1",
        info=SimpleNamespace(fusion=stored),
        photo_paths=lambda rows: {},
        texts_of=lambda ids: {},
        photo_index_of=lambda i: 0,
        text_sum_norms=None,
    )


def _search(
    ranker: hybrid.HybridRanker,
    channels: _Channels,
    language: LanguageInfo,
    mode: str,
    min_score: Any = "auto",
    explain: bool = False,
) -> hybrid.HybridPage:
    served = SimpleNamespace(
        index=SimpleNamespace(total_rows=N),
        items=lambda rows: [{"id": f"i{r}"} for r in rows],
        image_base="/v1/images",
    )
    return ranker.text(
        served, channels, np.zeros(8, np.float32), "courgette", language, mode=mode, top_k=10, offset=0,  # type: ignore[arg-type]
        allowed_rows=None, min_score=min_score, sort=None, explain=explain, cosine_labels=(0.99, 0.995),
    )  # fmt: skip


@pytest.fixture
def ask(monkeypatch: pytest.MonkeyPatch) -> Any:
    features = np.random.default_rng(0).random((N, len(FEATURES))).astype(np.float32)

    def gather(*args: Any, use_text: bool = True, **kwargs: Any) -> Candidates:
        f = features.copy()
        if not use_text:
            f[:, 1:] = 0.0
        return Candidates(
            rows=np.arange(N, dtype=np.int64),
            features=f,
            ranks=np.tile(np.arange(N, dtype=np.int64)[:, None], (1, 3)),
            photo=np.zeros(N, np.int64),
            text=np.zeros(N, np.int64),
            lexical=np.full(N, -1, np.int64),
        )

    monkeypatch.setattr(hybrid, "gather", gather)

    def run(
        fusion: FusionModel, language: LanguageInfo, mode: str = "hybrid", min_score: Any = "auto"
    ) -> tuple[Any, list[Any], float | None]:
        page = _search(hybrid.HybridRanker(), _channels(fusion.to_dict()), language, mode, min_score)
        thresholds = page.thresholds.none_below if page.thresholds is not None else None
        run.page = page  # type: ignore[attr-defined]
        return page.label, [h.match for h in page.hits], thresholds

    return run


def test_an_uncertain_query_takes_the_other_groups_better_label(ask: Any) -> None:
    fusion = _fusion(english=-2.0, other=0.5)  # probabilities 0.12 (none) and 0.62 (weak)
    for mode in ("hybrid", "text"):
        assert ask(fusion, UNSURE, mode) == ("weak", ["weak"] * N, 0.5)
        for language in (HINTED, SURE):  # a known language keeps its own labels
            assert ask(fusion, language, mode) == ("none", ["none"] * N, 0.5)
        # The cut follows the labels: "weak" keeps the hits the other group labels weak.
        assert len(ask(fusion, UNSURE, mode, "weak")[1]) == N and ask(fusion, HINTED, mode, "weak")[1] == []


def test_labels_stay_where_the_other_group_is_no_better_or_does_not_apply(ask: Any) -> None:
    both_weak = _fusion(english=0.4, other=0.6)
    assert ask(both_weak, UNSURE) == ask(both_weak, HINTED) == ("weak", ["weak"] * N, 0.5)
    fusion = _fusion(english=-2.0, other=0.5)
    # Image mode labels by the photos' cosines (none below 0.99): the hybrid match models do not apply.
    assert ask(fusion, UNSURE, "image") == ask(fusion, HINTED, "image") == ("none", ["none"] * N, 0.99)
    # Read as a language the shop does not write: already the other group's labels.
    assert ask(fusion, FOREIGN) == ("weak", ["weak"] * N, 0.5)
    # The detected group labels nothing: neither does an uncertain query (no cut either).
    uncalibrated = _fusion(english=-2.0, other=-1.0, english_none_below=None)
    assert ask(uncalibrated, UNSURE, "text", "weak") == ask(uncalibrated, HINTED, "text", "weak")
    assert ask(uncalibrated, UNSURE, "text", "weak")[0] is None
    # No match models (labels read each group's fused score, on scales of their own): nothing compared.
    legacy = _fusion(english=None, other=None)
    legacy.hybrid[OTHER].bias = legacy.text[OTHER].bias = 5.0  # the other group's fused scores: all strong
    assert ask(legacy, UNSURE) == ask(legacy, HINTED)
    assert "strong" not in ask(legacy, UNSURE)[1]


def test_the_match_score_is_what_the_label_reads(ask: Any) -> None:
    """``match_score`` (the response's) is the probability or cosine the query's label was read from, on the
    scale of the thresholds returned with it; None where nothing was labelled."""
    fusion = _fusion(english=-2.0, other=0.5)
    ask(fusion, UNSURE)  # labelled by the other group's match model
    assert ask.page.match_score == pytest.approx(1 / (1 + np.exp(-0.5)))
    ask(fusion, HINTED)
    assert ask.page.match_score == pytest.approx(1 / (1 + np.exp(2.0)))
    assert ask.page.match_score < ask.page.thresholds.none_below and ask.page.label == "none"
    ask(fusion, HINTED, "image")  # the best photo's cosine (the top candidate's: ranked by it)
    cosines = [h.score for h in ask.page.hits]
    assert ask.page.match_score == pytest.approx(max(cosines)) and ask.page.label == "none"
    ask(_fusion(english=-2.0, other=-1.0, english_none_below=None), HINTED, "text")
    assert ask.page.label is None and ask.page.match_score is None


def test_a_group_without_strong_from_labels_and_reports_nothing_strong(ask: Any) -> None:
    """A group whose ``strong_from`` is missing (a hand-edited version) labels nothing strong, and its answer
    reports no strong line either: a client comparing ``match_score`` with ``match_thresholds`` reads the
    same label. The answer survives the result cache's round trip."""
    from service.search.responses import ResponseBuilder

    fusion = _fusion(english=3.0, other=3.0)  # probability 0.95: strong by a line at 0.8
    for params in (fusion.hybrid["en"], fusion.hybrid[OTHER]):
        params.strong_from = None
    label, matches, _ = ask(fusion, HINTED)
    page = ask.page
    assert label == "weak" and set(matches) == {"weak"}
    assert page.match_score == pytest.approx(0.9526, abs=1e-4)
    builder = ResponseBuilder("m")
    served = SimpleNamespace(version="v1")
    response = builder.hybrid(
        served, page.hits, label=page.label, params=page.thresholds, match_score=page.match_score,
        search_s=0.0, mode="hybrid", language=HINTED, encode_s=0.0, start=0.0,
    )  # fmt: skip
    assert response.match_thresholds is not None and response.match_thresholds.strong_from is None
    assert response.match_score == page.match_score and response.match == "weak"
    cached = builder.cached_text(served, builder.cache_entry(response), language=HINTED, start=0.0)
    assert cached is not None and cached.match_thresholds == response.match_thresholds
    assert cached.match_score == response.match_score


def test_a_stored_fusion_that_cannot_be_parsed_is_searched_by_reciprocal_rank(
    ask: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A version whose stored fusion model cannot be parsed (``store.products.hybrid.FusionModel.from_dict``)
    is
    searched as one with too little text to calibrate: reciprocal-rank fusion, no fused match labels (hybrid
    mode: the photos' cosine labels), one warning for the version however often it is searched. Every
    hybrid and text search of it answered 503 (the format error) or 500 (a malformation parsing let
    through)."""
    ranker = hybrid.HybridRanker()
    rrf_scores = [1 / (61 + r) * 3 for r in range(N)]  # every channel ranks candidate r r-th
    for stored, _ in MALFORMED_FUSIONS:
        channels = _channels(stored)
        for mode in ("hybrid", "text", "hybrid"):
            page = _search(ranker, channels, HINTED, mode, explain=True)
            assert [h.id for h in page.hits] == [f"i{r}" for r in range(N)]
            if mode == "hybrid":
                assert [h.score for h in page.hits] == pytest.approx(rrf_scores)
            assert {h.explain.method for h in page.hits if h.explain} == {"rrf"}
            if mode == "text":
                assert page.label is None and page.thresholds is None
            else:
                assert page.label == "none" and page.thresholds.none_below == 0.99  # type: ignore[union-attr]
    assert caplog.text.count("fused by reciprocal rank") == len(MALFORMED_FUSIONS)


def test_a_fusion_that_cannot_be_parsed_still_reads_an_uncertain_query_for_the_shops_languages(
    ask: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Searched by reciprocal rank, a version whose fusion cannot be parsed still analyses a query of
    uncertain language for each language the shop writes in (as one fitted by reciprocal rank does), read
    leniently from what it stores."""
    asked: list[list[str | None]] = []
    real = hybrid.readings_of

    def readings_of(text: str, languages: list[str | None]) -> list[list[str]]:
        asked.append(list(languages))
        return real(text, languages)

    monkeypatch.setattr(hybrid, "readings_of", readings_of)
    stored = {**_fusion(english=0.0, other=0.0).to_dict(), "languages": ["de", "sv", 3, "xx"]}
    stored["hybrid"] = ["not", "a", "table"]
    channels = _channels(stored)
    channels.info.language_counts = {"en": 5, "de": 3, "sv": 2}  # "xx": no text value is in it
    _search(hybrid.HybridRanker(), channels, UNSURE, "hybrid")
    assert asked == [["en", "de", "sv"]]
    for damaged in (["de"], {"languages": "de"}):
        assert hybrid.stored_languages(SimpleNamespace(fusion=damaged, language_counts={"de": 1})) == []


def test_a_stand_in_ranks_and_labels_as_a_stored_reciprocal_rank_fusion_and_explains_itself_apart(
    ask: Any,
) -> None:
    """Reciprocal rank in place of a fusion that cannot be parsed
    (``store.products.hybrid.FusionModel.stored``)
    ranks and labels as the one a build stores with too little text, and explains itself as it always did:
    group ``other`` whatever the query's language (it has no other), method ``none`` in image mode (the
    photos' cosines alone), where a stored one names the query's language and its own method."""
    built = FusionModel.reciprocal_rank(["en"]).to_dict()
    damaged = {**built, "hybrid": ["not", "a", "table"]}
    for mode in ("hybrid", "text", "image"):
        pages = []
        for stored in (built, damaged):
            channels = _channels(stored)
            channels.info.language_counts = {"en": 3}
            pages.append(_search(hybrid.HybridRanker(), channels, HINTED, mode, explain=True))
        own, stand_in = pages
        assert [(h.id, h.score, h.match) for h in stand_in.hits] == [
            (h.id, h.score, h.match) for h in own.hits
        ]
        assert (stand_in.label, stand_in.thresholds, stand_in.match_score) == (
            own.label,
            own.thresholds,
            own.match_score,
        )
        assert {h.explain.group for h in own.hits if h.explain} == {"en"}
        assert {h.explain.group for h in stand_in.hits if h.explain} == {OTHER}
        assert {h.explain.method for h in own.hits if h.explain} == {"rrf"}
        assert {h.explain.method for h in stand_in.hits if h.explain} == {
            "none" if mode == "image" else "rrf"
        }


def test_a_stored_number_that_is_not_finite_is_searched_by_reciprocal_rank_and_answers(ask: Any) -> None:
    """A stored fusion holding a NaN, an infinity or an int no float holds (weights, mean, std, match
    weights, bias, thresholds) is searched by reciprocal rank, its answer built and encoded as the route
    answers it: it parsed, then every hybrid and text search failed (OverflowError fusing: a 500) or read
    NaN scores and thresholds."""
    from service.schemas import SearchResponse
    from service.search.responses import ResponseBuilder

    ranker = hybrid.HybridRanker()
    builder = ResponseBuilder("m")
    rrf_scores = [1 / (61 + r) * 3 for r in range(N)]  # every channel ranks candidate r r-th
    for stored, _ in NOT_FINITE_FUSIONS:
        channels = _channels(stored)
        for mode in ("hybrid", "text"):
            page = _search(ranker, channels, HINTED, mode, explain=True)
            assert [h.id for h in page.hits] == [f"i{r}" for r in range(N)]
            assert {h.explain.method for h in page.hits if h.explain} == {"rrf"}
            if mode == "hybrid":
                assert [h.score for h in page.hits] == pytest.approx(rrf_scores)
                # Labelled by the photos' cosines, as a version without fused match labels.
                assert page.thresholds is not None and page.thresholds.none_below == 0.99
            else:
                assert page.label is None and page.thresholds is None
            served = SimpleNamespace(version="v1")
            response = builder.hybrid(
                served, page.hits, label=page.label, params=page.thresholds, match_score=page.match_score,  # type: ignore[arg-type]
                search_s=0.0, mode=mode, language=HINTED, encode_s=0.0, start=0.0,
            )  # fmt: skip
            assert SearchResponse.model_validate_json(response.model_dump_json()) == response
