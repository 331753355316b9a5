"""The one door to a version's stored fusion (``store.products.hybrid.FusionModel.stored``): the stored
model, or
reciprocal rank in its place (``FusionModel.reciprocal_rank``) where none is stored or it cannot be parsed,
with the problem named. The service, the probes, ``ccrk index verify`` and a rebuild's reuse all read it."""

from __future__ import annotations

import numpy as np
import pytest

from store.products.hybrid import (
    CHANNELS,
    FEATURES,
    OTHER,
    Candidates,
    FusionModel,
    GroupParams,
    StoredFusion,
    rrf,
)
from tests.store.test_products import MALFORMED_FUSIONS

WEIGHTED = {
    "method": "weighted",
    "languages": ["en", "sv"],
    "hybrid": {"en": {"weights": [0.1, 0.2, 0.3, 0.4]}, OTHER: {"weights": [0.4, 0.3, 0.2, 0.1]}},
    "text": {OTHER: {"weights": [0.2, 0.3, 0.4], "none_below": 0.3, "strong_from": 0.7}},
}


def test_a_stored_fusion_that_parses_is_the_one_used() -> None:
    stored = FusionModel.stored(WEIGHTED, ["de"])
    assert stored == StoredFusion(FusionModel.from_dict(WEIGHTED))
    assert stored.problem is None and not stored.stand_in
    assert stored.model.languages == ["en", "sv"]  # its own, not the fallback's
    # A reciprocal-rank model a build stored (too little text) is the version's own too.
    built = FusionModel.reciprocal_rank(["en"])
    assert FusionModel.stored(built.to_dict()) == StoredFusion(built)


@pytest.mark.parametrize(("data", "fault"), MALFORMED_FUSIONS)
def test_a_stored_fusion_that_cannot_be_parsed_is_replaced_by_reciprocal_rank_naming_the_fault(
    data: object, fault: str
) -> None:
    stored = FusionModel.stored(data, ["en", "de"])
    assert stored.stand_in and stored.model == FusionModel.reciprocal_rank(["en", "de"])
    assert stored.problem is not None and fault in stored.problem
    assert stored.problem.startswith("products.json: ")  # the format error's text, as verify names it


def _full_group(width: int) -> dict[str, object]:
    """A group's parameters with every numeric field stored (legacy features: ``width`` of them)."""
    return {
        "weights": [0.25] * width,
        "bias": 0.1,
        "mean": [0.5] * width,
        "std": [0.2] * width,
        "none_below": 0.3,
        "strong_from": 0.7,
        "match": [0.5] * (width - 1) + [-1.0],  # the match features (mode text: without the image), a bias
    }


FULL = {
    "method": "logistic",
    "languages": ["en"],
    "hybrid": {"en": _full_group(4), OTHER: _full_group(4)},
    "text": {"en": _full_group(3), OTHER: _full_group(3)},
}


def _spoiled(field: str, value: object) -> dict[str, object]:
    """``FULL`` with ``field`` of the text mode's ``other`` group (its first value, for a list) ``value``."""
    group = dict(_full_group(3))
    group[field] = [value, *group[field][1:]] if isinstance(group[field], list) else value  # type: ignore[index]
    return {**FULL, "text": {**FULL["text"], OTHER: group}}  # type: ignore[dict-item]


# Numbers JSON reads that no search can use: NaN and infinities (``json.loads`` reads NaN, Infinity), and
# an integer too long for a float. They passed the parse, then every search of the version failed (500):
# OverflowError fusing, NaN scores and thresholds. And a bool (JSON's true/false), which Python counts as an
# int: a threshold of false read as 0 labelled every answer strong.
NOT_FINITE = [10**400, float("nan"), float("inf"), -float("inf"), False]
NOT_FINITE_FUSIONS = [
    (_spoiled(field, value), field)
    for field in ("weights", "bias", "mean", "std", "match", "none_below", "strong_from")
    for value in NOT_FINITE
]


def test_a_full_stored_fusion_parses() -> None:
    """The base of ``NOT_FINITE_FUSIONS`` is sound: each of them is refused for its one spoiled value."""
    assert FusionModel.stored(FULL) == StoredFusion(FusionModel.from_dict(FULL))


@pytest.mark.parametrize(("data", "field"), NOT_FINITE_FUSIONS)
def test_a_stored_number_that_is_not_finite_or_no_float_holds_is_replaced_by_reciprocal_rank(
    data: dict[str, object], field: str
) -> None:
    """A weight, mean, std, match weight, bias or threshold that is NaN, infinite, or an int beyond a
    float's range (a hand-edited or damaged ``products.json``) is a problem named by the parse (what ``ccrk
    index verify`` reports, and what keeps a rebuild from carrying it forward): the version is searched by
    reciprocal rank. It passed, and every search of the version failed."""
    stored = FusionModel.stored(data, ["en"])
    assert stored.stand_in and stored.model == FusionModel.reciprocal_rank(["en"])
    assert stored.problem is not None and stored.problem.startswith(f"products.json: fusion text/{OTHER}: ")
    assert f"{field} " in stored.problem and "finite" in stored.problem
    assert len(stored.problem) < 300  # a 401-digit int is not echoed whole


@pytest.mark.parametrize("data", [{}, None])
def test_no_stored_fusion_is_reciprocal_rank_without_a_problem(data: object) -> None:
    stored = FusionModel.stored(data, ["sv"])
    assert stored == StoredFusion(FusionModel.reciprocal_rank(["sv"]), None, stand_in=True)
    assert FusionModel.stored(data).model.languages == []


def test_reciprocal_rank_fuses_by_rank_without_match_labels() -> None:
    """What ``indexer.fusion_calibration`` stores with too little text: method rrf, one ``other`` group
    without weights or match model (labels then read nothing fused), scoring as ``rrf`` does."""
    model = FusionModel.reciprocal_rank(["en"])
    assert model.method == "rrf" and model.languages == ["en"]
    for table in (model.hybrid, model.text):
        assert table == {OTHER: GroupParams(weights=[])}
    params = model.params("hybrid", model.group_of(["en"]))
    assert params.none_below is None and params.strong_from is None and not params.match
    n = 5
    ranks = np.stack([np.arange(n), np.arange(n)[::-1], np.array([0, -1, 1, -1, 2])], axis=1)
    cands = Candidates(
        rows=np.arange(n, dtype=np.int64),
        features=np.zeros((n, len(FEATURES)), np.float32),
        ranks=ranks.astype(np.int64),
        photo=np.zeros(n, np.int64),
        text=np.zeros(n, np.int64),
        lexical=np.zeros(n, np.int64),
    )
    assert ranks.shape[1] == len(CHANNELS)
    for mode in ("hybrid", "text"):
        np.testing.assert_array_equal(model.score(cands, mode, "en"), rrf(cands, mode))


@pytest.mark.parametrize("std", [0.0, -0.2])
def test_a_stored_std_that_is_not_positive_is_replaced_by_reciprocal_rank(std: float) -> None:
    """Features are divided by each group's std: one of 0 or below scored inf or NaN (fits keep it above
    1e-6, so only a hand edit gets here)."""
    stored = FusionModel.stored(_spoiled("std", std), ["en"])
    assert stored.stand_in and stored.problem is not None and "std " in stored.problem
    assert "positive" in stored.problem
