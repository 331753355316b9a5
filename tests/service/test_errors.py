"""Bad input is answered with the right 4xx naming the field, never a 500; 503 without an index."""

from __future__ import annotations

import io
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

from tests.fixtures import Catalogue, LiveServer, make_settings, write_version

GOOD = {"query": "a red mug"}
JSON = {"content-type": "application/json"}


def png(size: tuple[int, int] = (8, 8)) -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise(size, 64).convert("RGB").save(buffer, format="PNG")
    return buffer.getvalue()


# (method, path, keyword arguments of httpx, expected status, a field the error must name or None)
CASES = [
    ("post", "/v1/search", {"json": {}}, 422, "query"),
    ("post", "/v1/search", {"json": {"query": ""}}, 422, "query"),
    ("post", "/v1/search", {"json": {"query": "   \t "}}, 422, "query"),
    ("post", "/v1/search", {"json": {"query": "x" * 600}}, 422, "query"),
    ("post", "/v1/search", {"json": {"query": 5}}, 422, "query"),
    ("post", "/v1/search", {"json": {**GOOD, "top_k": 0}}, 422, "top_k"),
    ("post", "/v1/search", {"json": {**GOOD, "top_k": 201}}, 422, "top_k"),
    ("post", "/v1/search", {"json": {**GOOD, "top_k": "many"}}, 422, "top_k"),
    ("post", "/v1/search", {"json": {**GOOD, "offset": -1}}, 422, "offset"),
    ("post", "/v1/search", {"json": {**GOOD, "rerank_k": 513}}, 422, "rerank_k"),
    ("post", "/v1/search", {"json": {**GOOD, "lang": "english!"}}, 422, "lang"),
    ("post", "/v1/search", {"json": {**GOOD, "rerank": "maybe"}}, 422, "rerank"),
    ("post", "/v1/search", {"json": {**GOOD, "colour": "red"}}, 422, "colour"),
    ("post", "/v1/search", {"json": {**GOOD, "filters": {"material": "wood"}}}, 422, "material"),
    ("post", "/v1/search", {"json": {**GOOD, "filters": {"count": {}}}}, 422, "count"),
    ("post", "/v1/search", {"json": {**GOOD, "filters": {"count": {"gte": "two"}}}}, 422, "count"),
    ("post", "/v1/search", {"json": {**GOOD, "filters": {"colour": []}}}, 422, "colour"),
    ("post", "/v1/search", {"json": {**GOOD, "filters": ["colour"]}}, 422, "filters"),
    (
        "post",
        "/v1/search",
        {"content": b"{not json", "headers": {"content-type": "application/json"}},
        422,
        None,
    ),
    ("post", "/v1/search", {"content": b"query=x", "headers": {"content-type": "text/plain"}}, 422, None),
    (
        "post",
        "/v1/search",
        {
            "content": b'{"query": "' + b"x" * (2 << 20) + b'"}',
            "headers": {"content-type": "application/json"},
        },
        413,
        None,
    ),
    # Input no one on the project wrote: lone surrogates (valid JSON escapes), invalid UTF-8, non-finite and
    # out-of-range numbers, deep nesting, huge keys. Each a 4xx, and the answer itself encodes.
    ("post", "/v1/search", {"content": b'{"query": "\\ud800 mug"}', "headers": JSON}, 422, "query"),
    ("post", "/v1/search", {"content": b'{"query": "mug \\udfff"}', "headers": JSON}, 422, "query"),
    (
        "post",
        "/v1/search",
        {"content": b'{"query": "x", "filters": {"colour": "\\ud800"}}', "headers": JSON},
        422,
        "colour",
    ),
    (
        "post",
        "/v1/search",
        {"content": b'{"query": "x", "\\ud800": 1}', "headers": JSON},
        422,
        None,
    ),
    ("post", "/v1/search", {"content": b'{"query": "\xff\xfe mug"}', "headers": JSON}, 400, None),
    ("post", "/v1/search", {"content": b"[" * 100_000 + b"]" * 100_000, "headers": JSON}, 400, None),
    ("post", "/v1/search", {"content": b'{"query": "x", "top_k": 1e999}', "headers": JSON}, 422, "top_k"),
    ("post", "/v1/search", {"content": b'{"query": "x", "top_k": NaN}', "headers": JSON}, 422, "top_k"),
    ("post", "/v1/search", {"json": {**GOOD, "top_k": 2**70}}, 422, "top_k"),
    ("post", "/v1/search", {"json": {**GOOD, "filters": {"count": 2**63}}}, 422, "count"),
    ("post", "/v1/search", {"json": {**GOOD, "filters": {"count": [1, -(2**64)]}}}, 422, "count"),
    (
        "post",
        "/v1/search",
        {"content": b'{"query": "x", "filters": {"count": NaN}}', "headers": JSON},
        422,
        "count",
    ),
    (
        "post",
        "/v1/search",
        {"content": b'{"query": "x", "filters": {"count": {"gte": Infinity}}}', "headers": JSON},
        422,
        "count",
    ),
    ("post", "/v1/search", {"json": {**GOOD, "k" * 100_000: 1}}, 422, None),  # see the echo test below
    ("post", "/v1/search", {"json": {**GOOD, "filters": {"k" * 100_000: 1}}}, 422, "filters"),
    (
        "post",
        "/v1/search",
        {"json": {**GOOD, "filters": {"count": 1, "n": {"a": {"b": {"c": [[[1]]]}}}}}},
        422,
        "n",
    ),
    (
        "post",
        "/v1/consistency",
        {"content": b'{"queries": {"en": "\\ud800", "de": "x"}}', "headers": JSON},
        422,
        "en",
    ),
    (
        "post",
        "/v1/search/image",
        {"files": {"file": ("a.png", png(), "image/png")}, "data": {"filters": '{"colour": "\\ud800"}'}},
        422,
        "filters",
    ),
    (
        "post",
        "/v1/search/image",
        {"files": {"file": ("a.png", png(), "image/png")}, "data": {"filters": '{"count": 1e999}'}},
        422,
        "filters",
    ),
    ("get", "/", {"params": {"q": "\ud800".encode("utf-8", "surrogatepass")}}, 200, None),
    ("post", "/v1/search/image", {"data": {"top_k": "3"}}, 422, "file"),
    ("post", "/v1/search/image", {"files": {"file": ("a.png", b"", "image/png")}}, 422, "file"),
    ("post", "/v1/search/image", {"files": {"file": ("a.gif", b"GIF89a....", "image/gif")}}, 415, "file"),
    ("post", "/v1/search/image", {"files": {"file": ("a.txt", b"hello", "text/plain")}}, 415, "file"),
    ("post", "/v1/search/image", {"files": {"file": ("a.png", b"hello world", "image/png")}}, 415, "file"),
    (
        "post",
        "/v1/search/image",
        {"files": {"file": ("a.png", png((64, 64))[:2000], "image/png")}},
        422,
        "file",
    ),
    (
        "post",
        "/v1/search/image",
        {"files": {"file": ("a.png", png(), "image/png")}, "data": {"top_k": "0"}},
        422,
        "top_k",
    ),
    (
        "post",
        "/v1/search/image",
        {"files": {"file": ("a.png", png(), "image/png")}, "data": {"filters": "{bad"}},
        422,
        "filters",
    ),
    (
        "post",
        "/v1/search/image",
        {"files": {"file": ("a.png", png(), "image/png")}, "data": {"filters": '{"material": "wood"}'}},
        422,
        "material",
    ),
    (
        "post",
        "/v1/search/image",
        {"files": {"file": ("big.png", b"\0" * (11 << 20), "image/png")}},
        413,
        None,
    ),
    ("post", "/v1/consistency", {"json": {"queries": {"en": "a red mug"}}}, 422, "queries"),
    (
        "post",
        "/v1/consistency",
        {"json": {"queries": {f"l{i:02d}"[:3]: "x" for i in range(21)}}},
        422,
        "queries",
    ),
    ("post", "/v1/consistency", {"json": {"queries": {"en": "red mug", "de": ""}}}, 422, "de"),
    ("post", "/v1/consistency", {"json": {"queries": {"en": "a", "?!": "b"}}}, 422, "queries"),
    ("post", "/v1/consistency", {"json": {"queries": {"en": "a", "de": "b"}, "top_k": 0}}, 422, "top_k"),
    ("get", "/", {"params": {"lang": "xx"}}, 422, "lang"),  # the search page's shared-link parameters
    ("get", "/", {"params": {"lang": "not a code"}}, 422, "lang"),
    ("get", "/", {"params": {"q": "x" * 513}}, 422, "q"),
    ("get", "/v1/images/unknown-id", {}, 404, "item_id"),
    ("get", "/v1/images/x", {"params": {"size": 5000}}, 422, "size"),
    ("get", "/v1/nothing-here", {}, 404, None),
    ("get", "/v1/search", {}, 405, None),
    ("post", "/v1/admin/reload", {}, 401, "x-api-key"),
    ("post", "/v1/admin/reload", {"headers": {"x-api-key": "wrong"}}, 401, "x-api-key"),
    (
        "post",
        "/v1/admin/reload",
        {"headers": {"x-api-key": "test-admin-key"}, "params": {"version": "../x"}},
        422,
        "version",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "field"), CASES, ids=[f"{c[1]}-{n}" for n, c in enumerate(CASES)]
)
def test_bad_input_table(
    client: httpx.Client, method: str, path: str, kwargs: dict, status: int, field: str | None
) -> None:
    response = client.request(method.upper(), path, **kwargs)
    assert response.status_code == status, response.text
    if field is not None:
        locs = [[str(part) for part in error["loc"]] for error in response.json()["detail"]]
        assert any(field in loc for loc in locs), (field, locs)


def test_echoed_input_is_bounded_and_made_safe(client: httpx.Client) -> None:
    """A rejected value comes back cut to 200 characters, lone surrogates replaced, NaN as text."""
    long_key = client.post("/v1/search", json={**GOOD, "k" * 100_000: "v" * 100_000})
    assert long_key.status_code == 422 and len(long_key.content) < 2000
    (error,) = long_key.json()["detail"]
    assert error["loc"][1].startswith("k" * 200) and len(error["loc"][1]) == 201
    surrogate = client.post("/v1/search", content=b'{"query": "\\ud800 mug"}', headers=JSON)
    (error,) = surrogate.json()["detail"]
    assert error["loc"] == ["body", "query"] and error["input"] == "? mug"
    nan = client.post("/v1/search", content=b'{"query": "x", "filters": {"count": NaN}}', headers=JSON)
    assert nan.status_code == 422 and "nan" in nan.text.lower()


def test_no_index_is_503_then_a_published_version_is_picked_up(tmp_path: Path, catalogue: Catalogue) -> None:
    with LiveServer(make_settings(tmp_path)) as live, live.client() as c:
        assert c.get("/healthz").status_code == 200
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "no published version" in ready.json()["detail"]
        response = c.post("/v1/search", json=GOOD)
        assert response.status_code == 503
        assert "no index loaded" in response.json()["detail"][0]["msg"]
        assert c.get("/v1/index").status_code == 503
        # Every route that reads the index says so, the image search before it reads the upload or waits
        # for a decoding slot.
        image = c.post("/v1/search/image", files={"file": ("q.png", png(), "image/png")})
        assert image.status_code == 503 and "no index loaded" in image.json()["detail"][0]["msg"]
        both = {"queries": {"en": "a red mug", "de": "eine rote Tasse"}}
        assert c.post("/v1/consistency", json=both).status_code == 503
        assert c.get("/v1/images/test-000000").status_code == 503
        version = write_version(tmp_path, catalogue)
        for _ in range(100):  # the poller looks every 0.2 s
            if c.get("/readyz").status_code == 200:
                break
            time.sleep(0.05)
        assert c.get("/readyz").json()["index_version"] == version
        assert c.post("/v1/search", json=GOOD).status_code == 200


def test_index_of_another_model_is_refused_with_both_names(tmp_path: Path, catalogue: Catalogue) -> None:
    write_version(tmp_path, catalogue, fingerprint="0" * 64)
    with LiveServer(make_settings(tmp_path)) as live, live.client() as c:
        ready = c.get("/readyz")
        assert ready.status_code == 503
        assert "ccrk-demo" in ready.json()["detail"] and "000000000000" in ready.json()["detail"]
        assert c.post("/v1/search", json=GOOD).status_code == 503


def test_admin_disabled_without_key(tmp_path: Path, index_root: Path) -> None:
    with LiveServer(make_settings(index_root, admin_api_key=None)) as live, live.client() as c:
        assert c.post("/v1/admin/reload", headers={"x-api-key": "anything"}).status_code == 404
