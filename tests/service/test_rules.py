"""Merchandising rules through the HTTP API (``service.api.routes.rules``, ``service.search.rules``): admin
CRUD behind the admin key, pins at their position (a product no channel found too), hide, boost and bury,
``explain`` naming the rules, the result cache not hiding an edited rule, 422s naming the field for bad
rules, and no hostile body ever a 5xx. A product index of the shared synthetic catalogue (60 products, one
photo and an English title each), built by the indexer with the shipped demo model; real uvicorn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from indexer.build import build
from service.rule_schemas import MAX_ACTIONS, MAX_PIN_POSITION, MAX_RULES
from store.rules import rules_path, write_rules
from tests.fixtures import INDEX_NAME, Catalogue, LiveServer, make_settings

ADMIN = {"X-API-Key": "test-admin-key"}
RULES = f"/v1/admin/indexes/{INDEX_NAME}/rules"


@pytest.fixture(scope="module")
def products(catalogue: Catalogue) -> list[dict[str, Any]]:
    return [
        {
            "id": f"p{i}",
            "paths": [str(r.image)],
            "title": r.captions["en"][0],
            "brand": "acme" if i % 4 == 0 else "other",
            "price": i,
        }
        for i, r in enumerate(catalogue.records)
    ]


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory, products: list[dict[str, Any]]) -> Iterator[LiveServer]:
    work = tmp_path_factory.mktemp("rules-shop")
    rows = products
    manifest = work / "products.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    root = work / "indexes"
    settings = Settings(
        model_dir=DEFAULT_MODEL_DIR,
        backend="onnx",
        index_root=root,
        threads=1,
        index_workers=0,
        text_fields=["title"],
        redis_url=None,
        history_db=work / "history.sqlite",
    )
    assert build(INDEX_NAME, [manifest], settings=settings).published
    with LiveServer(make_settings(root, history_db=work / "serve-history.sqlite")) as live:
        yield live


@pytest.fixture()
def client(shop: LiveServer) -> Iterator[httpx.Client]:
    with shop.client() as c:
        yield c
    write_rules(Path(shop.app.state.runtime.settings.index_root), INDEX_NAME, [])  # the next test has none


def _search(client: httpx.Client, query: str, **extra: Any) -> dict[str, Any]:
    answer = client.post("/v1/search", json={"query": query, "top_k": 10, **extra})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _put(client: httpx.Client, rule_id: str, **body: Any) -> httpx.Response:
    return client.put(f"{RULES}/{rule_id}", headers=ADMIN, json=body)


@pytest.fixture()
def query(client: httpx.Client, products: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """A query of the catalogue (its first product's title) and its first page's ids without rules."""
    title = products[0]["title"]
    return title, [h["id"] for h in _search(client, title)["results"]]


def test_rules_need_the_admin_key(client: httpx.Client) -> None:
    body = {"query": "a red mug", "actions": [{"hide": {"brand": "acme"}}]}
    assert client.get(RULES).status_code == 401
    assert client.put(f"{RULES}/r1", json=body).status_code == 401
    assert client.put(f"{RULES}/r1", json=body, headers={"X-API-Key": "wrong"}).status_code == 401
    assert client.delete(f"{RULES}/r1").status_code == 401
    assert client.get("/v1/admin/indexes/elsewhere/rules", headers=ADMIN).status_code == 404


def test_rules_are_written_read_listed_and_deleted(client: httpx.Client, shop: LiveServer) -> None:
    body = {"query": "a red mug", "threshold": 0.7, "actions": [{"pin": "p3", "position": 2}]}
    written = _put(client, "mugs", **body)
    assert written.status_code == 200, written.text
    assert written.json() == {"id": "mugs", "lang": None, "enabled": True, **body}
    listed = client.get(RULES, headers=ADMIN).json()
    assert [r["id"] for r in listed["rules"]] == ["mugs"] and listed["etag"]
    assert listed["limits"] == {"max_rules": MAX_RULES, "max_actions": MAX_ACTIONS, "max_pin_position": 100}
    assert client.get(f"{RULES}/mugs", headers=ADMIN).json()["actions"] == body["actions"]
    replaced = _put(client, "mugs", **{**body, "enabled": False})
    assert replaced.json()["enabled"] is False
    after = client.get(RULES, headers=ADMIN).json()
    assert len(after["rules"]) == 1 and after["etag"] != listed["etag"]
    assert rules_path(
        Path(shop.app.state.runtime.settings.index_root), INDEX_NAME
    ).is_file()  # beside versions
    assert client.delete(f"{RULES}/mugs", headers=ADMIN).status_code == 204
    assert client.get(f"{RULES}/mugs", headers=ADMIN).status_code == 404
    assert client.delete(f"{RULES}/mugs", headers=ADMIN).status_code == 404


def test_a_pin_holds_its_position_and_is_marked_and_explained(
    client: httpx.Client, query: tuple[str, list[str]]
) -> None:
    query, plain = query
    target = next(f"p{i}" for i in range(59, 0, -1) if f"p{i}" not in plain[:3])
    assert _put(
        client, "pin", query=query, threshold=0.95, actions=[{"pin": target, "position": 2}]
    ).is_success
    hits = _search(client, query, explain=True)["results"]
    assert hits[1]["id"] == target and hits[1]["pinned"] is True and hits[1]["rank"] == 1
    assert hits[1]["explain"]["rules"] == ["pin"]
    assert not any(h["pinned"] for h in hits[:1] + hits[2:]) and hits[0]["explain"]["rules"] == []
    assert [h["id"] for h in hits if h["id"] != target][:3] == [i for i in plain if i != target][:3]
    # Positions count over the whole list: the next page starts after it.
    page = _search(client, query, offset=1, top_k=1)["results"]
    assert [h["id"] for h in page] == [target] and page[0]["rank"] == 1
    # A request filter that leaves the pinned product out wins over the pin.
    brand = "acme" if int(target[1:]) % 4 == 0 else "other"
    other = "acme" if brand == "other" else "other"
    assert target not in [h["id"] for h in _search(client, query, filters={"brand": other})["results"]]


def test_a_pin_brings_a_product_no_channel_found(client: httpx.Client, query: tuple[str, list[str]]) -> None:
    query, _ = query
    # Mode image searches the photos alone: its 50 candidates leave 10 of the 60 products out.
    found = {h["id"] for h in _search(client, query, mode="image", top_k=50, explain=True)["results"]}
    outside = sorted({f"p{i}" for i in range(60)} - found)
    assert outside, "every product was a candidate"
    assert _put(
        client, "far", query=query, threshold=0.95, actions=[{"pin": outside[0], "position": 1}]
    ).is_success
    hits = _search(client, query, mode="image", top_k=5, explain=True)["results"]
    assert hits[0]["id"] == outside[0] and hits[0]["pinned"] and hits[0]["explain"]["rules"] == ["far"]
    assert hits[0]["explain"]["channels"]["image"]["rank"] is None  # in no channel's list


def test_hide_drops_the_products_its_filter_matches(
    client: httpx.Client, query: tuple[str, list[str]]
) -> None:
    query, plain = query
    brands = {h["id"]: h["metadata"]["brand"] for h in _search(client, query, top_k=60)["results"]}
    assert "acme" in brands.values()
    assert _put(
        client, "no-acme", query=query, threshold=0.95, actions=[{"hide": {"brand": "acme"}}]
    ).is_success
    hits = _search(client, query, top_k=60)["results"]
    assert hits and all(h["metadata"]["brand"] == "other" for h in hits)
    assert [h["id"] for h in hits] == [i for i in brands if brands[i] == "other"]
    # A hidden product is not shown even where another rule pins it.
    acme = next(i for i in plain if brands[i] == "acme")
    assert _put(
        client, "pin-acme", query=query, threshold=0.95, actions=[{"pin": acme, "position": 1}]
    ).is_success
    assert acme not in [h["id"] for h in _search(client, query, top_k=60)["results"]]


def test_boost_and_bury_reorder_and_are_explained(client: httpx.Client, query: tuple[str, list[str]]) -> None:
    query, _ = query
    before = [(h["id"], h["metadata"]["brand"]) for h in _search(client, query, top_k=60)["results"]]
    acme = [i for i, b in before if b == "acme"]
    assert acme and before[0][1] == "acme"  # p0 itself leads its own title's results
    assert _put(
        client, "up", query=query, threshold=0.95, actions=[{"bury": {"brand": "acme"}, "weight": 1.0}]
    ).is_success
    buried = _search(client, query, top_k=60, explain=True)["results"]
    assert [h["id"] for h in buried[-len(acme) :]] == acme  # last, in their own order
    assert all(h["explain"]["rules"] == (["up"] if h["metadata"]["brand"] == "acme" else []) for h in buried)
    boost = {"query": query, "threshold": 0.95, "actions": [{"boost": {"price": {"gte": 50}}, "weight": 1.0}]}
    assert _put(client, "up", **boost).is_success
    boosted = _search(client, query, top_k=60)["results"]
    high = [h["id"] for h in boosted if h["metadata"]["price"] >= 50]
    assert [h["id"] for h in boosted[: len(high)]] == high and len(high) == 10
    # A small weight moves them less than a full one: the order differs from both.
    assert _put(
        client, "up", **{**boost, "actions": [{"boost": {"price": {"gte": 50}}, "weight": 0.05}]}
    ).is_success
    slight = [h["id"] for h in _search(client, query, top_k=60)["results"]]
    assert slight != [h["id"] for h in boosted] and slight != [i for i, _ in before]


def test_a_rule_does_not_act_on_an_unrelated_query_or_when_disabled(
    client: httpx.Client, query: tuple[str, list[str]]
) -> None:
    query, plain = query
    rule = {"query": query, "threshold": 0.95, "actions": [{"pin": plain[-1], "position": 1}]}
    assert _put(client, "pin", **rule).is_success
    assert _search(client, query)["results"][0]["pinned"]
    unrelated = _search(client, "zzqx unrelated gibberish 12345")["results"]
    assert not any(h["pinned"] for h in unrelated)
    assert _put(client, "pin", **{**rule, "enabled": False}).is_success
    assert not any(h["pinned"] for h in _search(client, query)["results"])


def test_an_edited_rule_is_not_hidden_by_the_result_cache(
    client: httpx.Client, query: tuple[str, list[str]]
) -> None:
    query, plain = query
    _search(client, query, top_k=5)
    assert _search(client, query, top_k=5)["cached"] is True
    assert _put(
        client, "fresh", query=query, threshold=0.95, actions=[{"pin": plain[-1], "position": 1}]
    ).is_success
    answer = _search(client, query, top_k=5)
    assert answer["cached"] is False and answer["results"][0]["id"] == plain[-1]


def test_rules_written_beside_the_server_are_read_without_a_restart(
    client: httpx.Client, query: tuple[str, list[str]], shop: LiveServer
) -> None:
    """Another process's write (here the store's, as a second server process writes): seen at the next
    search; a filter naming a field the served version lacks is skipped there, the rule's other actions
    act; a file that is not a rules file serves searches without rules and refuses edits (409)."""
    root = Path(shop.app.state.runtime.settings.index_root)
    query, plain = query
    actions = [{"boost": {"colour": "red"}, "weight": 1.0}, {"pin": plain[-1], "position": 1}]
    write_rules(root, INDEX_NAME, [{"id": "outside", "query": query, "threshold": 0.95, "actions": actions}])
    hits = _search(client, query, explain=True)["results"]
    assert hits[0]["id"] == plain[-1] and hits[0]["explain"]["rules"] == ["outside"]
    rules_path(root, INDEX_NAME).write_text("{broken")
    assert not any(h["pinned"] for h in _search(client, query)["results"])
    assert client.get(RULES, headers=ADMIN).status_code == 409
    assert _put(client, "x", query="q", actions=[{"hide": {"brand": "acme"}}]).status_code == 409
    write_rules(root, INDEX_NAME, [])


def _refused(client: httpx.Client, body: dict[str, Any], rule_id: str = "bad") -> list[Any]:
    answer = client.put(f"{RULES}/{rule_id}", headers=ADMIN, json=body)
    assert answer.status_code == 422, (body, answer.status_code, answer.text)
    return answer.json()["detail"][0]["loc"]


def test_bad_rules_are_refused_naming_the_field(client: httpx.Client) -> None:
    ok = {"query": "a red mug", "actions": [{"hide": {"brand": "acme"}}]}
    assert _refused(client, {**ok, "actions": [{"hide": {}}]})[:4] == ["body", "actions", 0, "hide"]
    assert _refused(client, {**ok, "actions": [{"boost": {"colour": "red"}, "weight": 0.5}]}) == [
        "body", "actions", 0, "boost", "colour",
    ]  # fmt: skip
    assert _refused(client, {**ok, "actions": [{"pin": "no-such-product", "position": 1}]}) == [
        "body", "actions", 0, "pin",
    ]  # fmt: skip
    for position in (0, MAX_PIN_POSITION + 1, 1.5, "first"):
        loc = _refused(client, {**ok, "actions": [{"pin": "p1", "position": position}]})
        assert loc[:3] == ["body", "actions", 0] and loc[-1] == "position"
    for weight in (0, -0.5, 1.5, "NaN"):
        assert (
            _refused(client, {**ok, "actions": [{"bury": {"brand": "acme"}, "weight": weight}]})[-1]
            == "weight"
        )
    assert (
        _refused(client, {**ok, "actions": [{"pin": "p1", "position": 1, "hide": {"brand": "acme"}}]})[-1]
        == "hide"
    )
    assert _refused(client, {**ok, "actions": [{"promote": "p1"}]}) == ["body", "actions", 0]
    assert _refused(client, {**ok, "actions": []}) == ["body", "actions"]
    assert _refused(client, {**ok, "actions": ok["actions"] * (MAX_ACTIONS + 1)}) == ["body", "actions"]
    assert _refused(client, {**ok, "threshold": 0}) == ["body", "threshold"]
    assert _refused(client, {**ok, "threshold": 1.01}) == ["body", "threshold"]
    assert _refused(client, {**ok, "query": ""}) == ["body", "query"]
    assert _refused(client, {**ok, "extra": 1}) == ["body", "extra"]
    assert _refused(client, ok, rule_id="-starts-with-a-dash") == ["path", "rule_id"]
    assert client.get(RULES, headers=ADMIN).json()["rules"] == []  # nothing refused was written


def test_an_index_takes_at_most_max_rules(client: httpx.Client, shop: LiveServer) -> None:
    root = Path(shop.app.state.runtime.settings.index_root)
    rule = {"query": "a red mug", "threshold": 0.8, "actions": [{"hide": {"brand": "acme"}}]}
    write_rules(root, INDEX_NAME, [{"id": f"r{i}", **rule} for i in range(MAX_RULES)])
    assert _refused(client, rule, rule_id="one-more") == ["path", "rule_id"]
    assert _put(client, "r0", **{**rule, "threshold": 0.9}).status_code == 200  # a replacement still fits
    write_rules(root, INDEX_NAME, [])


HOSTILE = st.one_of(
    st.sampled_from(
        ['"\\ud800"', '"a\\u0000b"', "NaN", "Infinity", "1e999", str(2**63), "null", "{", '"\xff"']
    ),
    st.integers(1, 2000).map(lambda depth: "[" * depth + "]" * depth),
    st.sampled_from(['{"' + "k" * 50_000 + '": 1}', '{"\\ud800": 1}', "[]", "{}", '"x"', "true", "-1"]),
)
FIELDS = {
    "query": '"a red mug"',
    "threshold": "0.8",
    "lang": '"de"',
    "enabled": "true",
    "actions": '[{"boost": {"brand": "acme"}, "weight": 0.5}, {"pin": "p1", "position": 2}]',
}
ACTION_FIELDS = {
    "boost": '{{"boost": {{"brand": {v}}}, "weight": 0.5}}',
    "weight": '{{"bury": {{"brand": "acme"}}, "weight": {v}}}',
    "hide": '{{"hide": {v}}}',
    "pin": '{{"pin": {v}, "position": 1}}',
    "position": '{{"pin": "p1", "position": {v}}}',
}


@given(field=st.sampled_from(sorted(FIELDS) + sorted(ACTION_FIELDS)), hostile=HOSTILE)
@settings(
    max_examples=80, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
def test_hostile_rule_bodies_never_5xx(shop: LiveServer, field: str, hostile: str) -> None:
    fields = dict(FIELDS)
    if field in ACTION_FIELDS:
        fields["actions"] = "[" + ACTION_FIELDS[field].format(v=hostile) + "]"
    else:
        fields[field] = hostile
    body = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
    raw = body.encode("utf-8", "surrogateescape") if "\xff" not in body else body.encode("latin-1", "replace")
    answer = httpx.put(
        f"{shop.url}{RULES}/hostile",
        content=raw,
        headers={**ADMIN, "content-type": "application/json"},
        timeout=30,
    )
    assert answer.status_code < 500, (body[:300], answer.status_code, answer.text[:300])
    answer.json()
    httpx.delete(f"{shop.url}{RULES}/hostile", headers=ADMIN, timeout=30)


def test_no_5xx_over_the_rules_routes_schema_with_the_admin_key(shop: LiveServer) -> None:
    schema = schemathesis.openapi.from_url(shop.url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations() if "/rules" in r.ok().path]
    assert len(operations) == 4
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=25,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            def check(case: schemathesis.Case) -> None:
                if (
                    case.path_parameters
                    and case.meta is not None
                    and case.meta.generation.mode is GenerationMode.POSITIVE
                ):
                    case.path_parameters["name"] = INDEX_NAME  # past the 404 to the body's checks
                response = case.call(base_url=shop.url, headers=ADMIN, timeout=30)
                case.validate_response(response, checks=[not_a_server_error])

            check()


def test_a_pin_counts_in_no_facet_whose_filters_leave_it_out(
    client: httpx.Client, query: tuple[str, list[str]]
) -> None:
    """Disjunctive facets re-rank once per filtered field, each under its own filters: a pin allowed under
    one field's (brand's: the price filter alone) is no result under another's (price's: brand other)."""
    query, _ = query
    target = "p8"  # brand acme, price 8
    assert _put(
        client, "pin", query=query, threshold=0.95, actions=[{"pin": target, "position": 1}]
    ).is_success
    extra = {"top_k": 60, "min_score": -1.0}
    both = _search(
        client, query, facets=["brand", "price"], filters={"brand": "other", "price": {"gte": 0}}, **extra
    )
    alone = _search(client, query, facets=["price"], filters={"brand": "other"}, **extra)
    brand = _search(client, query, facets=["brand"], filters={"price": {"gte": 0}}, **extra)
    assert target in [h["id"] for h in brand["results"]] and target not in [h["id"] for h in alone["results"]]
    assert both["facets"][0] == brand["facets"][0]  # brand's counts: the price filter alone, the pin in them
    assert both["facets"][1] == alone["facets"][0]  # price's counts: brand other alone, without the pin


def test_a_hidden_product_does_not_label_the_query(
    client: httpx.Client, query: tuple[str, list[str]]
) -> None:
    """The query's match label and score read the products a shopper can be shown: with the best match
    (p0, its own title's product) hidden, they are those of the best product left."""
    query, plain = query
    assert plain[0] == "p0"
    before = _search(client, query)
    assert before["match_score"] is not None
    assert _put(
        client, "no-p0", query=query, threshold=0.95, actions=[{"hide": {"price": {"lt": 1}}}]
    ).is_success
    after = _search(client, query)
    assert "p0" not in [h["id"] for h in after["results"]]
    assert after["match_score"] is not None and after["match_score"] < before["match_score"]
