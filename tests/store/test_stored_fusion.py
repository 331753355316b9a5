"""The one door to a version's stored fusion (``store.hybrid.FusionModel.stored``): the stored model, or
reciprocal rank in its place (``FusionModel.reciprocal_rank``) where none is stored or it cannot be parsed,
with the problem named. The service, the probes, ``ccrk index verify`` and a rebuild's reuse all read it."""

from __future__ import annotations

import numpy as np
import pytest

from store.hybrid import (
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
