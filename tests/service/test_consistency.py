"""POST /v1/consistency on real queries (the report itself is checked by hand in
tests/monitoring/test_consistency.py)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from model.metrics import mrv, mrv_std
from tests.fixtures import Catalogue


def test_consistency_endpoint(client: httpx.Client, catalogue: Catalogue) -> None:
    record = catalogue.records[12]
    queries = {lang: record.captions[lang][0] for lang in ("en", "de", "ja", "ru")}
    body = client.post("/v1/consistency", json={"queries": queries, "top_k": 5, "rerank": False}).json()
    lists = {entry["lang"]: entry["ids"] for entry in body["languages"]}
    assert list(lists) == ["en", "de", "ja", "ru"] and all(len(ids) == 5 for ids in lists.values())
    assert all(record.id in ids for ids in lists.values())  # the same item in every language
    for entry in body["languages"]:
        assert entry["language"]["source"] == "hint" and entry["language"]["code"] == entry["lang"]
        # each list is what /v1/search returns for that query
        search = client.post("/v1/search", json={"query": entry["query"], "top_k": 5, "rerank": False}).json()
        assert [h["id"] for h in search["results"]] == entry["ids"]
    # Numbers recomputed from the lists with model.metrics.
    union = list(dict.fromkeys(i for ids in lists.values() for i in ids))
    table = np.array([[ids.index(i) if i in ids else 5 for ids in lists.values()] for i in union])
    assert [item["id"] for item in body["items"]] == union
    assert body["mrv"] == pytest.approx(mrv(table)) and body["mrv_std"] == pytest.approx(mrv_std(table))
    assert len(body["pairs"]) == 6
    for pair in body["pairs"]:
        assert pair["overlap"] == pytest.approx(len(set(lists[pair["a"]]) & set(lists[pair["b"]])) / 5)
    assert body["mean_overlap"] == pytest.approx(np.mean([p["overlap"] for p in body["pairs"]]))
