"""JSON the service parses itself is bounded (size, depth) before ``json.loads``; a bug's 500 carries the
security headers and leaves the connection usable (a real uvicorn on loopback)."""

from __future__ import annotations

import io
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
    deep = '{"a":' * 1500 + "1" + "}" * 1500  # 3,000 levels would be the same answer; 12 KB
    with server.client() as client:
        answer = client.post(
            "/v1/search/image", files={"file": ("a.png", png(), "image/png")}, data={"filters": deep}
        )
        assert answer.status_code == 422, answer.text
        (error,) = answer.json()["detail"]
        assert error["loc"] == ["body", "filters"]
        assert error["msg"] == (
            "filters must be a JSON object of filters: JSON nested 1500 levels deep; at most 32 are accepted"
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
