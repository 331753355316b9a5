"""JSON the service parses itself is bounded (size, depth) before ``json.loads``; a bug's 500 carries the
security headers and leaves the connection usable (a real uvicorn on loopback)."""

from __future__ import annotations

import io
import json
import socket

import pytest
from PIL import Image

from service.json_limits import JsonLimitError, nesting_depth, parse_json
from tests.fixtures import LiveServer


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, format="PNG")
    return buffer.getvalue()


def test_depth_ignores_brackets_in_strings_and_refuses_deep_text() -> None:
    assert nesting_depth('{"a": [1, {"b": "[[[[{{{{"}]}') == 3
    assert nesting_depth("3") == 0
    assert parse_json('{"a": [1, 2]}') == {"a": [1, 2]}
    with pytest.raises(JsonLimitError, match="nested 3000 levels deep; at most 32"):
        parse_json("[" * 3000 + "]" * 3000)
    with pytest.raises(JsonLimitError, match="nested 10000 levels"):
        parse_json('{"a":' * 10_000)  # unclosed: still no recursion
    with pytest.raises(JsonLimitError, match="70,000 bytes; at most 65,536"):
        parse_json(" " * 70_000)
    with pytest.raises(JsonLimitError, match="not valid JSON"):
        parse_json("{bad")


def test_nested_filters_form_field_is_a_422_naming_filters(server: LiveServer) -> None:
    deep = '{"a":' * 3000 + "1" + "}" * 3000  # 18 KB: the 500 of the outside sweep (a RecursionError)
    with server.client() as client:
        answer = client.post(
            "/v1/search/image", files={"file": ("a.png", png(), "image/png")}, data={"filters": deep}
        )
        assert answer.status_code == 422, answer.text
        (error,) = answer.json()["detail"]
        assert error["loc"] == ["body", "filters"]
        assert error["msg"] == (
            "filters must be a JSON object of filters: JSON nested 3000 levels deep; at most 32 are accepted"
        )
        assert answer.headers["x-frame-options"] == "DENY"
        # The 422 of a wrong filter says where and what, without pydantic's internals.
        wrong = client.post(
            "/v1/search/image",
            files={"file": ("a.png", png(), "image/png")},
            data={"filters": '["colour"]'},
        )
        assert wrong.status_code == 422
        (error,) = wrong.json()["detail"]
        assert (
            error["msg"]
            == "filters must be a JSON object of filters: value: Input should be a valid dictionary"
        )
        assert "pydantic" not in wrong.text and "input_value" not in wrong.text


# Marks of pydantic's internals in an answer: its schema's labels for union members and validators (with
# memory addresses), class names, input echoes and documentation links.
INTERNALS = ("function-", " at 0x", "union[", "literal[", "constrained-", "[key]", "RangeFilter", "pydantic",
             "input_value", ".int:", ".float:", ".str:", ".bool:")  # fmt: skip

# (filter value, the message of its one 422)
BAD_FILTERS: list[tuple[object, str]] = [
    ({"gte": "abc"}, "range gte: Input should be a valid number, unable to parse string as a number"),
    ({"in": 5}, "range in: Extra inputs are not permitted"),
    ({}, "range: a range needs at least one of gte, gt, lte, lt"),
    ({"b": {"c": 1}}, "range b: Extra inputs are not permitted"),
    ({"lt": [1, 2]}, "range lt: Input should be a valid number"),
    ([1, {"a": 1}], "item 1: an object is not a string, number or boolean"),
    ([1, [2]], "item 1: a list is not a string, number or boolean"),
    ([], "a list of 0 values; a list takes 1 to 100"),
    ("x" * 300, "a string of 300 characters; at most 256 are taken"),
    (2**63, "integers must lie within -2**63 .. 2**63 - 1"),
    (
        None,
        "null is not a filter: a string, number or boolean, a list of them, or a range {gte, gt, lte, lt}",
    ),
]


def test_a_bad_filter_is_one_422_naming_it_without_pydantic_internals(server: LiveServer) -> None:
    """Each bad filter value, in the JSON body and in the image form: one error at the filter's place with
    what is wrong (pydantic answered one error per member of the union, placed at its validator functions'
    names with their memory addresses, e.g. ``function-after[functools.partial(<function ... at 0x..>``)."""
    with server.client() as client:
        for value, msg in BAD_FILTERS:
            body = client.post("/v1/search", json={"query": "a red mug", "filters": {"colour": value}})
            assert body.status_code == 422, (value, body.text)
            (error,) = body.json()["detail"]
            assert error["loc"] == ["body", "filters", "colour"] and error["msg"] == msg, (value, error)
            form = client.post(
                "/v1/search/image",
                files={"file": ("a.png", png(), "image/png")},
                data={"filters": json.dumps({"colour": value})},
            )
            assert form.status_code == 422, (value, form.text)
            (error,) = form.json()["detail"]
            assert error == {
                "loc": ["body", "filters"],
                "msg": f"filters must be a JSON object of filters: colour: {msg}",
                "type": "invalid_input",
            }
            for answer in (body, form):
                assert not [mark for mark in INTERNALS if mark in answer.text], answer.text
        # The same for the other union of the request and a bad filter name: the places are the request's.
        others = [
            ({"min_score": "bogus"}, ["body", "min_score"]),
            ({"filters": {"a b": 1}}, ["body", "filters", "a b"]),
        ]
        for extra, loc in others:
            answer = client.post("/v1/search", json={"query": "a red mug", **extra})
            assert answer.status_code == 422
            assert {tuple(e["loc"]) for e in answer.json()["detail"]} == {tuple(loc)}, answer.text
            assert not [mark for mark in INTERNALS if mark in answer.text], answer.text
        # An unknown field of the request keeps its own name, whatever it looks like.
        answer = client.post("/v1/search", json={"query": "a red mug", "literal[x]": 1})
        assert answer.json()["detail"][0]["loc"] == ["body", "literal[x]"]


def test_a_forced_500_has_security_headers_and_keeps_the_connection(server: LiveServer) -> None:
    facade = server.app.state.runtime.search

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a bug")

    facade.pipeline.text = broken  # type: ignore[method-assign]
    try:
        host, port = server.url.removeprefix("http://").split(":")
        body = b'{"query": "a red mug"}'
        request = (
            b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(request)
            first = read_response(conn)
            assert first.startswith(b"HTTP/1.1 500"), first[:200]
            head = first.split(b"\r\n\r\n")[0].lower()
            for header in (b"x-content-type-options: nosniff", b"x-frame-options: deny", b"content-security"):
                assert header in head, head
            assert first.endswith(b'{"detail":[{"loc":[],"msg":"internal error","type":"internal"}]}')
            assert b"a bug" not in first
            del facade.pipeline.text  # the class's own method again: the same connection answers
            conn.sendall(request)
            second = read_response(conn)
            assert second.startswith(b"HTTP/1.1 200"), second[:200]
    finally:
        facade.pipeline.__dict__.pop("text", None)


def read_response(conn: socket.socket) -> bytes:
    """One HTTP response with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = conn.recv(65536)
        assert chunk, "connection closed mid-body"
        rest += chunk
    return head + b"\r\n\r\n" + rest
