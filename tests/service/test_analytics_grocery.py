"""Search analytics on real data: the shared grocery half (``../shared/data/grocery``; skipped where absent)
served with the starter model, searched with the product-type queries of ``bench/data/grocery_queries.json``
in every language they are written in. Seeded simulated shoppers click the first product of the query's
type on the page for a known share of the searches, a share of their own per language; the report's
searches, clicks, CTR and MRR per language are theirs exactly, and its top 'none' queries per language are
the searches the service labelled 'none'."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from typing import Any

import pytest

from store.analytics import normalise_query
from tests.fixtures import LiveServer
from tests.service.test_rules_grocery import ADMIN, QUERIES, grocery

__all__ = ["grocery"]  # the module's fixture: the grocery half built and served


def test_simulated_shoppers_are_reported_exactly(grocery: tuple[LiveServer, list[dict[str, Any]]]) -> None:
    live, rows = grocery
    spec = json.loads(QUERIES.read_text(encoding="utf-8"))
    type_of = {r["id"]: r["product_type"] for r in rows}
    rng = random.Random(49)
    started = time.time() - 1.0
    searched: dict[str, list[float]] = {}  # lang: [searches, clicked, sum of 1 / rank]
    nones: dict[str, Counter[str]] = {}
    shares: dict[str, float] = {}
    with live.client() as client:
        for kind in ("in_catalogue", "not_sold"):
            for product_type, forms in spec[kind].items():
                for lang, query in forms.items():
                    answer = client.post("/v1/search", json={"query": query, "lang": lang, "top_k": 10})
                    assert answer.status_code == 200, answer.text
                    body = answer.json()
                    code = body["language"]["code"]
                    totals = searched.setdefault(code, [0, 0, 0.0])
                    totals[0] += 1
                    if body["match"] == "none":
                        nones.setdefault(code, Counter())[normalise_query(query)] += 1
                    share = shares.setdefault(code, 0.2 + 0.1 * (len(shares) % 6))
                    ids = [h["id"] for h in body["results"]]
                    first = next((i for i in ids if type_of.get(i) == product_type), None)
                    if kind == "in_catalogue" and first is not None and rng.random() < share:
                        event = {"kind": "click", "query_id": body["query_id"], "product_id": first}
                        sent = client.post("/v1/events", json={"events": [event]}, headers=ADMIN)
                        assert sent.status_code == 200, sent.text
                        totals[1] += 1
                        totals[2] += 1.0 / (ids.index(first) + 1)
        live.app.state.runtime.recorder("grocery").flush()
        answer = client.get("/v1/analytics", params={"since": started}, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    report = {x["lang"]: x for x in answer.json()["languages"]}
    assert set(report) == set(searched)
    assert sum(clicked for _, clicked, _ in searched.values()) > 0
    for lang, (n, clicked, rr) in searched.items():
        got = report[lang]
        assert (got["queries"], got["clicked"]) == (n, clicked), lang
        assert got["ctr"] == pytest.approx(clicked / n, abs=1e-6), lang
        assert got["mrr"] == pytest.approx(rr / n, abs=1e-6), lang
        want = sorted(nones.get(lang, Counter()).items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        assert [(q["query"], q["count"]) for q in got["top_none_queries"]] == want, lang
