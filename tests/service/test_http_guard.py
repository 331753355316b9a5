"""The HTTP edge against slow and oversized requests (a real `ccrk serve` process, bounded loopback
traffic): a body trickling in is closed at the total body limit however short its pauses; clients of one
address cannot fill the process's connection cap (by default a quarter of it at most); an oversized request
head is a 431 with the security headers of every answer."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import httpx

from service.http_guard import HeadWithBody
from tests.service.conftest import ServeProcess

HEAD = (
    b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
)


def read_all(conn: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := conn.recv(65536):
            data += chunk
    return data


def trickle(port: int, every_s: float, for_s: float) -> float | None:
    """Send a request head, then one body byte every ``every_s`` seconds for at most ``for_s`` seconds:
    the seconds after the head at which the server closed the connection, None if it never did."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
        slow.sendall(HEAD)
        started = time.monotonic()
        while time.monotonic() - started < for_s:
            try:
                slow.sendall(b" ")
                slow.settimeout(every_s)
                if slow.recv(1024) == b"":
                    return time.monotonic() - started
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - started
            except TimeoutError:
                pass
    return None


def test_a_trickling_body_is_closed_at_the_total_limit(index_root: Path) -> None:
    """One byte a second never pauses past the 30 s pause limit; the 3 s total limit closes it."""
    index = ("--index-root", str(index_root), "--index-name", "shop")
    with ServeProcess(*index, env={"CCRK_HTTP_BODY_TOTAL_S": "3"}) as served:
        closed_after = trickle(served.port, every_s=1.0, for_s=10.0)
        assert closed_after is not None, "a body trickling for 10 s was still open"
        assert 2.5 <= closed_after <= 5.0, closed_after
        # A normal search meanwhile and after: answered.
        assert (
            httpx.post(served.url + "/v1/search", json={"query": "a red mug"}, timeout=10).status_code == 200
        )


def test_a_body_of_a_byte_every_20_s_is_closed_at_the_total_limit(index_root: Path) -> None:
    """The outside sweep's body, a byte every 20 s under the default 30 s pause limit (it was still open at
    69 s), is closed when the total limit of 25 s is up (a timer: not at its next byte, 40 s)."""
    index = ("--index-root", str(index_root), "--index-name", "shop")
    with ServeProcess(*index, env={"CCRK_HTTP_BODY_TOTAL_S": "25"}) as served:
        closed_after = trickle(served.port, every_s=20.0, for_s=60.0)
        assert closed_after is not None, "a body of a byte every 20 s was still open at 60 s"
        assert 24.5 <= closed_after <= 28.0, closed_after


def test_slow_clients_of_one_address_do_not_block_another(index_root: Path) -> None:
    """25 slow bodies from 127.0.0.2, with the cap at 20 and 10 per address: 10 are held, 15 refused with a
    503 at once, and a search from 127.0.0.1 is answered (with the cap alone, it was a 503)."""
    index = ("--index-root", str(index_root), "--index-name", "shop")
    env = {"CCRK_MAX_CONNECTIONS": "20", "CCRK_MAX_CONNECTIONS_PER_CLIENT": "10"}
    sockets: list[socket.socket] = []
    with ServeProcess(*index, env=env) as served:
        try:
            for _ in range(25):
                conn = socket.socket()
                conn.bind(("127.0.0.2", 0))
                conn.settimeout(5)
                conn.connect(("127.0.0.1", served.port))
                sockets.append(conn)
                with contextlib.suppress(OSError):
                    conn.sendall(HEAD + b" ")
            time.sleep(0.5)
            refused = []
            for conn in sockets[10:]:
                answer = read_all(conn)
                refused.append(answer.split(b"\r\n")[0])
                assert b"retry-after: 1" in answer and b"too many connections from your address" in answer
            assert refused == [b"HTTP/1.1 503 Service Unavailable"] * 15
            for _ in range(5):
                answer = httpx.post(served.url + "/v1/search", json={"query": "a red mug"}, timeout=10)
                assert answer.status_code == 200, answer.text
            for conn in sockets[:10]:  # still held open by the server, waiting for their bodies
                conn.settimeout(0.2)
                with contextlib.suppress(TimeoutError):
                    assert conn.recv(1) != b"", "a held connection was closed"
        finally:
            for conn in sockets:
                conn.close()


def test_one_address_holds_a_share_of_the_cap_by_default(index_root: Path) -> None:
    """The outside sweep's setup, CCRK_MAX_CONNECTIONS=20 and nothing else: 25 slow bodies from 127.0.0.2
    hold a quarter of the cap (5), the other 20 get a 503 at once, and searches from 127.0.0.1 are answered
    (with only max_connections_per_client, 100, they held the whole cap: every other client got a 503)."""
    index = ("--index-root", str(index_root), "--index-name", "shop")
    sockets: list[socket.socket] = []
    with ServeProcess(*index, env={"CCRK_MAX_CONNECTIONS": "20"}) as served:
        try:
            for _ in range(25):
                conn = socket.socket()
                conn.bind(("127.0.0.2", 0))
                conn.settimeout(5)
                conn.connect(("127.0.0.1", served.port))
                sockets.append(conn)
                with contextlib.suppress(OSError):
                    conn.sendall(HEAD + b" ")
            time.sleep(0.5)
            for conn in sockets[5:]:
                answer = read_all(conn)
                assert answer.startswith(b"HTTP/1.1 503 Service Unavailable"), answer[:100]
                assert b"at most 5" in answer and b"content-security-policy: default-src 'self'" in answer
            for _ in range(5):
                answer = httpx.post(served.url + "/v1/search", json={"query": "a red mug"}, timeout=10)
                assert answer.status_code == 200, answer.text
        finally:
            for conn in sockets:
                conn.close()


def test_an_oversized_request_head_is_a_431(index_root: Path) -> None:
    index = ("--index-root", str(index_root), "--index-name", "shop")
    with ServeProcess(*index) as served:
        fine = httpx.get(served.url + "/healthz", headers={"X-Pad": "a" * 20_000}, timeout=10)
        assert fine.status_code == 200
        for head in (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 65_000 + b"\r\n\r\n",  # one large header
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: aaaaaaaaaa\r\n" * 4000 + b"\r\n",  # many
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100_000,  # a header that never ends
        ):
            with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    conn.sendall(head)
                answer = read_all(conn)
            assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), answer[:100]
            assert b"over 32768 bytes" in answer and b"x-content-type-options: nosniff" in answer
            assert b"content-security-policy: default-src 'self'; script-src 'self';" in answer


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def test_a_response_head_goes_out_with_its_body() -> None:
    """HeadWithBody: the head is held until the body (one write), a 100 Continue is not held, a response
    without body bytes is flushed when it ends, and a close flushes first."""
    raw = RecordingTransport()
    transport = HeadWithBody(raw)  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert raw.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    transport.write(b"{}")
    transport.write(b"HTTP/1.1 200 looks like a head but is body")
    assert raw.writes[1:] == [
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 looks like a head but is body",
    ]
    head_only = RecordingTransport()
    transport = HeadWithBody(head_only)  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")  # a HEAD request's answer
    transport.flush()
    assert head_only.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"]
    closing = RecordingTransport()
    transport = HeadWithBody(closing)  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 500 Internal Server Error\r\n\r\n")
    transport.close()
    assert closing.writes == [b"HTTP/1.1 500 Internal Server Error\r\n\r\n"] and closing.closed
    assert transport.is_closing()


def test_head_requests_and_100_continue_on_a_kept_alive_connection(index_root: Path) -> None:
    """Through `ccrk serve`: a HEAD answer (no body) arrives and the connection serves the next request; a
    search that expects 100 Continue gets it before sending its body, then its answer."""
    index = ("--index-root", str(index_root), "--index-name", "shop")
    with ServeProcess(*index) as served, socket.create_connection(("127.0.0.1", served.port), 10) as conn:
        conn.settimeout(10)
        conn.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        head = conn.recv(65536)
        assert head.startswith(b"HTTP/1.1 ") and head.endswith(b"\r\n\r\n"), head
        body = b'{"query": "a red mug", "top_k": 3}'
        conn.sendall(
            b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"Expect: 100-continue\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        assert conn.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        conn.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            answer += conn.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 OK") and b'"results"' in answer
