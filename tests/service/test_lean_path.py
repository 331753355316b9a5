"""The lean request path of a text search (issue 27): ``POST /v1/search`` answered by
``service.api.fast_search`` instead of FastAPI's request machinery, and a short search answered on the event
loop instead of a worker thread: the same answers and the same errors as the route and the thread."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from indexer.build import build
from service.api.fast_search import TextSearchFastPath
from service.index_holder import Served
from service.schemas import SearchRequest
from service.search import facade as facade_module
from service.search.pipeline import INLINE_MAX_RESULTS, INLINE_MAX_SHARDS
from store.opening import open_version
from store.shards.sharded import ShardedIndex
from tests.fixtures import Catalogue, LiveServer, make_settings

QUERY = {"query": "a red striped mug", "top_k": 5, "rerank": False}


def comparable(body: dict[str, Any]) -> dict[str, Any]:
    """An answer less its timings, whether the result cache gave it (the second of two equal queries) and its
    query id (each search's own); both have one."""
    assert body["query_id"]
    return {k: v for k, v in body.items() if k not in ("timings_ms", "cached", "query_id")}


@pytest.fixture()
def router_calls(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Paths of the requests that reached FastAPI's router (the fast path handed them on)."""
    stack = server.app.router.middleware_stack
    assert isinstance(stack, TextSearchFastPath)
    calls: list[str] = []
    router = stack.app

    async def spy(scope: dict[str, Any], receive: Any, send: Any) -> None:
        calls.append(scope["path"])
        await router(scope, receive, send)

    monkeypatch.setattr(stack, "app", spy)
    yield calls


def test_fast_path_answers_as_the_route(client: httpx.Client, router_calls: list[str]) -> None:
    fast = client.post("/v1/search", json=QUERY)
    assert fast.status_code == 200 and router_calls == []
    # A content type the fast path leaves to FastAPI: the route's own answer.
    routed = client.post(
        "/v1/search", content=json.dumps(QUERY), headers={"content-type": "application/json; charset=utf-8"}
    )
    assert routed.status_code == 200 and router_calls == ["/v1/search"]
    assert comparable(fast.json()) == comparable(routed.json())
    assert {k: v for k, v in fast.headers.items() if k not in ("date", "content-length")} == {
        k: v for k, v in routed.headers.items() if k not in ("date", "content-length")
    }
    assert fast.headers["x-content-type-options"] == "nosniff"


def test_fast_path_hands_on_what_it_does_not_answer(client: httpx.Client, router_calls: list[str]) -> None:
    """Invalid bodies reach the router with their bytes (its 422s name the field, as before); and an invalid
    body with an unknown key still gets the dependencies' 401 before the body's 422."""
    bad = client.post("/v1/search", json={**QUERY, "top_k": 0})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "top_k"]
    not_json = client.post("/v1/search", content=b"{not json", headers={"content-type": "application/json"})
    assert not_json.status_code == 422 and not_json.json()["detail"][0]["type"] == "json_invalid"
    unknown_key = client.post("/v1/search", json={**QUERY, "top_k": 0}, headers={"X-API-Key": "no-such-key"})
    assert unknown_key.status_code == 401
    assert router_calls == ["/v1/search"] * 3
    # A valid body with an unknown key: the fast path's own 401, the same as the route's.
    fast_401 = client.post("/v1/search", json=QUERY, headers={"X-API-Key": "no-such-key"})
    assert fast_401.status_code == 401 and router_calls == ["/v1/search"] * 3
    assert fast_401.json() == unknown_key.json()
    assert fast_401.headers["www-authenticate"] == unknown_key.headers["www-authenticate"]


def test_fast_path_replays_the_body_it_read() -> None:
    seen: list[bytes] = []

    async def router(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.append(body)

    layer = TextSearchFastPath(router, router=None, route=None, limit=1024)
    chunks = [b'{"query": ', b'"x", "top_k": 0}']
    messages = [{"type": "http.request", "body": c, "more_body": n == 0} for n, c in enumerate(chunks)]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/search",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"32")],
    }
    asyncio.run(layer(scope, receive, lambda message: None))
    assert seen == [b"".join(chunks)]


def test_short_searches_run_on_the_event_loop(
    client: httpx.Client, server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search without re-ranking or filters runs on the event loop; one that re-ranks or filters goes to a
    worker thread."""
    runtime = server.app.state.runtime
    hops: list[str] = []
    run_sync = facade_module.anyio.to_thread.run_sync

    async def counted(func: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(func, "__name__", "") == "_text":  # not the index poller's checks
            hops.append("_text")
        return await run_sync(func, *args, **kwargs)

    monkeypatch.setattr(facade_module.anyio.to_thread, "run_sync", counted)
    with runtime.holder.lease() as served:
        short = runtime.pipeline.is_short(served, SearchRequest(**QUERY))
        deep = SearchRequest(**{**QUERY, "offset": INLINE_MAX_RESULTS, "top_k": 1})  # a wide ANN walk
        assert not runtime.pipeline.is_short(served, deep)
    assert short
    assert client.post("/v1/search", json=QUERY).status_code == 200
    assert hops == []
    filtered = client.post("/v1/search", json={**QUERY, "filters": {"category": "mug"}})
    assert filtered.status_code == 200 and hops == ["_text"]
    if runtime.pipeline.can_rerank:
        assert client.post("/v1/search", json={**QUERY, "rerank": True}).status_code == 200
        assert hops == ["_text", "_text"]
    monkeypatch.setattr(runtime.search, "inline", False)  # CCRK_INLINE_TEXT_SEARCH=false
    assert client.post("/v1/search", json=QUERY).status_code == 200
    assert hops[-1] == "_text"


def test_a_few_local_shards_are_short_many_are_not(
    server: LiveServer, catalogue: Catalogue, tmp_path: Path
) -> None:
    """A version of a few local shards or segments (what a small rebuild publishes) is searched on the
    event loop; one of more than INLINE_MAX_SHARDS goes to a worker thread."""
    source = tmp_path / "items.jsonl"
    source.write_text(
        "".join(
            json.dumps({"id": r.id, "image": str(r.image), "captions": r.captions}) + "\n"
            for r in catalogue.records[:24]
        ),
        encoding="utf-8",
    )
    pipeline = server.app.state.runtime.pipeline
    for shards, short in ((2, True), (INLINE_MAX_SHARDS + 1, False)):
        settings = make_settings(tmp_path / f"idx{shards}", index_shards=shards, index_workers=0)
        assert build("shop", [source], settings=settings).published
        with open_version(settings.index_root, "shop") as opened:
            assert isinstance(opened, ShardedIndex) and len(opened.shards) == shards
            assert pipeline.is_short(Served(opened), SearchRequest(**QUERY)) is short
