"""A merchandising rule written once in English acts on the same query in other languages, on real data:
the shared grocery half (``../shared/data/grocery``; skipped where absent) indexed with the starter model
(its multilingual text encoder), the product-type queries of ``bench/data/grocery_queries.json``. With the
threshold the docs recommend, a rule for "fruit juice" pins its product for the German, French and Japanese
forms of the query, and acts on none of the other product types' queries in any of the ten languages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ccrk_settings import Settings
from indexer.build import build
from service.rule_schemas import RECOMMENDED_THRESHOLD
from tests.fixtures import LiveServer, make_settings

REPO = Path(__file__).resolve().parents[2]
QUERIES = REPO / "bench" / "data" / "grocery_queries.json"
TEXT_FIELDS = ["title", "retailer_title", "description_en", "description_sv"]
ADMIN = {"X-API-Key": "test-admin-key"}


@pytest.fixture(scope="module")
def grocery(
    shared_data: Path, starter_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveServer, list[dict[str, Any]]]]:
    source = shared_data / "grocery"
    if not (source / "products.jsonl").is_file():
        pytest.skip(f"the shared grocery half is not at {source}")
    work = tmp_path_factory.mktemp("rules-grocery")
    rows = [json.loads(line) for line in (source / "products.jsonl").read_text().splitlines() if line.strip()]
    # Each product's first photo only: the rule is about the text encoder, and it keeps the build short.
    kept = [{**r, "paths": [str(source / r["paths"][0])]} for r in rows]
    manifest = work / "products.jsonl"
    manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), encoding="utf-8")
    settings = Settings(
        model_dir=starter_model,
        index_root=work / "indexes",
        threads=1,
        index_workers=0,
        text_fields=TEXT_FIELDS,
        redis_url=None,
        rerank=False,
        history_db=work / "history.sqlite",
    )
    assert build("grocery", [manifest], settings=settings).published
    serve = make_settings(
        work / "indexes", model_dir=starter_model, index_name="grocery", history_db=work / "serve.sqlite"
    )
    with LiveServer(serve) as live:
        yield live, rows


def _ids(client: httpx.Client, query: str, lang: str) -> list[dict[str, Any]]:
    answer = client.post("/v1/search", json={"query": query, "lang": lang, "top_k": 10, "explain": True})
    assert answer.status_code == 200, answer.text
    return answer.json()["results"]


def test_an_english_rule_pins_for_other_languages_and_not_for_unrelated_queries(
    grocery: tuple[LiveServer, list[dict[str, Any]]],
) -> None:
    live, rows = grocery
    spec = json.loads(QUERIES.read_text(encoding="utf-8"))
    juice = spec["in_catalogue"]["Juice"]
    with live.client() as client:
        first = _ids(client, juice["en"], "en")[0]["id"]
        target = next(r["id"] for r in rows if r["product_type"] == "Juice" and r["id"] != first)
        rule = {
            "query": juice["en"],
            "lang": "en",
            "threshold": RECOMMENDED_THRESHOLD,
            "actions": [{"pin": target, "position": 1}],
        }
        written = client.put("/v1/admin/indexes/grocery/rules/juice", headers=ADMIN, json=rule)
        assert written.status_code == 200, written.text
        for lang in ("en", "de", "fr", "ja"):
            top = _ids(client, juice[lang], lang)[0]
            assert (top["id"], top["pinned"], top["explain"]["rules"]) == (target, True, ["juice"]), lang
        acted = []
        for kind in ("in_catalogue", "not_sold"):
            for product_type, forms in spec[kind].items():
                if product_type == "Juice":
                    continue
                for lang, query in forms.items():
                    hits = _ids(client, query, lang)
                    if any(h["pinned"] or h["explain"]["rules"] for h in hits):
                        acted.append((product_type, lang, query))
        assert acted == []
