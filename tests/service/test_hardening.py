"""Hardening at the HTTP edge: security headers on every response, the API docs with no network, no server
path in 503 answers, a usable image link for an id with a line break, and connections that send no request
closed after the head timeout (a real `ccrk serve` process, bounded loopback traffic)."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures import Catalogue, LiveServer, make_settings, write_version
from tests.service.conftest import ServeProcess

REPO = Path(__file__).resolve().parents[2]
ROUTES = [
    ("GET", "/", None),
    ("GET", "/dashboard", None),
    ("GET", "/docs", None),
    ("GET", "/redoc", None),
    ("GET", "/openapi.json", None),
    ("GET", "/healthz", None),
    ("GET", "/readyz", None),
    ("GET", "/metrics", None),
    ("GET", "/v1/index", None),
    ("GET", "/v1/model", None),
    ("GET", "/v1/languages", None),
    ("POST", "/v1/search", {"query": "a red mug"}),
    ("POST", "/v1/search", {"query": ""}),  # a 422
    ("GET", "/v1/nothing", None),  # a 404
    ("GET", "/static/style.css", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_security_headers_on_every_route(server: LiveServer, method: str, path: str, body: object) -> None:
    with server.client() as client:
        response = client.request(method, path, json=body)
    headers = response.headers
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    assert headers["x-frame-options"] == "DENY"
    policy = headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'self'" in policy
    assert ("'unsafe-inline'" in policy.split("script-src")[1].split(";")[0]) == (path in ("/docs", "/redoc"))


def test_api_docs_need_no_network(server: LiveServer) -> None:
    with server.client() as client:
        for page in ("/docs", "/redoc"):
            html = client.get(page).text
            assert "cdn." not in html and "https://" not in html.split("<body")[0], page
        for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"):
            response = client.get(f"/docs-assets/{asset}")
            assert response.status_code == 200 and len(response.content) > 100_000, asset
        assert client.get("/docs-assets/../../etc/passwd").status_code == 404
        assert client.get("/static/favicon.svg").status_code == 200


def test_503_answers_hide_server_paths(tmp_path: Path) -> None:
    root = tmp_path / "secret-location" / "indexes"
    root.mkdir(parents=True)
    with LiveServer(make_settings(root)) as live, live.client() as client:
        ready = client.get("/readyz")
        search = client.post("/v1/search", json={"query": "x"})
    assert ready.status_code == 503 and search.status_code == 503
    for answer in (ready.text, search.text):
        assert "secret-location" not in answer and "<index root>" in answer, answer


def test_an_id_with_a_line_break_gets_a_working_image_link(tmp_path: Path, catalogue: Catalogue) -> None:
    records = list(catalogue.records)
    records[0] = dataclasses.replace(records[0], id="two\nlines")
    write_version(tmp_path, dataclasses.replace(catalogue, records=records))
    with LiveServer(make_settings(tmp_path)) as live, live.client() as client:
        hits = client.post("/v1/search", json={"query": records[0].captions["en"][0], "top_k": 60}).json()
        (hit,) = [h for h in hits["results"] if h["id"] == "two\nlines"]
        assert hit["image_url"] == "/v1/images?id=two%0Alines"
        image = client.get(hit["image_url"])
        assert image.status_code == 200 and image.headers["content-type"] == "image/png"
        assert client.get(f"/v1/images/{records[1].id}").status_code == 200  # plain ids keep their path


def test_silent_and_trickling_connections_are_closed(index_root: Path) -> None:
    sockets: list[socket.socket] = []
    index = ("--index-root", str(index_root), "--index-name", "shop")
    with ServeProcess(*index, env={"CCRK_HTTP_HEADER_TIMEOUT_S": "1"}) as served:
        url, port = served.url, served.port
        silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
        trickling = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
        sockets = silent + trickling
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40
        started = time.monotonic()
        for i in range(len(head)):  # one byte per 0.1 s: the head would take 4.4 s
            if time.monotonic() - started > 5:
                break
            for conn in trickling:
                with contextlib.suppress(OSError):
                    conn.sendall(head[i : i + 1])
            time.sleep(0.1)
        # Meanwhile the service answers others.
        assert httpx.post(url + "/v1/search", json={"query": "a red mug"}, timeout=10).status_code == 200
        for conn in sockets:
            conn.settimeout(5)
            with contextlib.suppress(ConnectionResetError):  # a reset is closed as well
                assert conn.recv(1024) == b"", "the server sent data instead of closing"
        assert time.monotonic() - started < 8
    for conn in sockets:
        conn.close()


def test_redactor_replaces_whole_path_components_only(tmp_path: Path) -> None:
    from service.security import Redactor

    redact = Redactor([(Path("/data"), "<index root>"), (Path("/data/models/m"), "<model dir>")])
    assert redact("no version under /data/shop") == "no version under <index root>/shop"
    assert redact("/data/models/m/config.json is damaged") == "<model dir>/config.json is damaged"
    assert redact("see /database and /data2 and my/data") == "see /database and /data2 and my/data"


def test_slow_uploads_pass_and_stalled_ones_are_closed(index_root: Path) -> None:
    """The body limit is on pauses, not on the whole upload: a body trickling in for 3 s with a 1 s limit
    is answered; one that stops for 2 s is closed."""
    index = ("--index-root", str(index_root), "--index-name", "shop")
    body = b'{"query": "a red mug", "top_k": 3}' + b" " * 300
    head = (
        b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    with ServeProcess(*index, env={"CCRK_HTTP_BODY_TIMEOUT_S": "1"}) as served:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as slow:
            slow.sendall(head)
            for start in range(0, len(body), 30):  # 12 chunks, 0.25 s apart: 3 s in all
                slow.sendall(body[start : start + 30])
                time.sleep(0.25)
            answer = slow.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as stalled:
            stalled.sendall(head + body[:20])
            time.sleep(2.0)
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                stalled.sendall(body[20:])
            with contextlib.suppress(ConnectionResetError):
                assert stalled.recv(65536) == b"", "a stalled upload was answered"
