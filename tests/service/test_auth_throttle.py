"""Failed authentication throttled per client address (``service.auth_throttle``): counted in Redis across
processes, in process without it or while it is down; by default 30 wrong keys a minute, then 429 with
Retry-After for every key that address sends, the right one too; the admin key compared in constant time;
`ccrk serve` warns about a short admin key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from typer.testing import CliRunner

from ccrk_cli.main import app as ccrk
from ccrk_settings import Settings, get_settings
from service.api import deps
from service.auth_throttle import AuthThrottle
from service.keys import KeyStore
from tests.fixtures import REDIS_URL, Catalogue, LiveServer, make_settings, write_version
from tests.service.conftest import free_port

QUERY = {"query": "red shoes", "top_k": 3}
DEFAULT_LIMIT = Settings.model_fields["auth_failures_per_minute"].default
ADMIN_KEY = "test-admin-key"


def throttle(url: str | None, prefix: str, limit: int = 3, **kwargs: object) -> AuthThrottle:
    return AuthThrottle(limit=limit, redis_url=url, prefix=prefix, timeout_s=0.5, retry_s=30.0, **kwargs)  # type: ignore[arg-type]


def test_failures_are_counted_across_processes_in_redis(redis_prefix: str) -> None:
    """Two throttles on one Redis (as two processes): the limit is shared, the 3rd failure still a 401,
    the process that sees the 4th refuses it and remembers the address; other addresses are apart."""
    one, two = throttle(REDIS_URL, redis_prefix + "af1:"), throttle(REDIS_URL, redis_prefix + "af1:")
    assert [one.failed("10.0.0.1"), two.failed("10.0.0.1"), one.failed("10.0.0.1")] == [None, None, None]
    assert one.blocked("10.0.0.1") is not None  # it saw the limit reached: the next attempts are 429
    assert two.blocked("10.0.0.1") is None  # it has not seen it yet ...
    wait = two.failed("10.0.0.1")  # ... until its next failure of that address
    assert wait is not None and 1 <= wait <= 60 and two.blocked("10.0.0.1") is not None
    assert one.blocked("10.0.0.2") is None and one.failed("10.0.0.2") is None
    client = redis.Redis.from_url(REDIS_URL)
    assert int(client.get(f"{redis_prefix}af1:af:10.0.0.1") or 0) == 4
    assert 1 <= client.ttl(f"{redis_prefix}af1:af:10.0.0.1") <= 60
    client.close()
    one.close()
    two.close()


def test_in_process_without_redis_and_while_it_is_down() -> None:
    """No Redis, or a Redis that does not answer: each process counts its own, and the window ends."""
    now = [1000.0]
    for url in (None, f"redis://127.0.0.1:{free_port()}/0"):
        local = throttle(url, "x:", clock=lambda: now[0])
        assert [local.failed("a") for _ in range(3)] == [None, None, None]
        assert local.backend == "memory"
        assert local.failed("a") == 60 and local.blocked("a") == 60
        now[0] += 59.5
        assert local.blocked("a") == 1
        now[0] += 1.0  # the minute is up: a fresh count
        assert local.blocked("a") is None and local.failed("a") is None
        local.close()


@pytest.fixture(scope="module")
def guarded(
    tmp_path_factory: pytest.TempPathFactory, catalogue: Catalogue
) -> Iterator[tuple[LiveServer, str]]:
    """A server with the default throttle (keys required) and a valid search key."""
    root = tmp_path_factory.mktemp("throttled")
    write_version(root, catalogue, rows=list(range(20)))
    _, key = KeyStore(root).create("search", [])
    settings = make_settings(root, search_requires_key=True, auth_failures_per_minute=DEFAULT_LIMIT)
    with LiveServer(settings) as live:
        yield live, key


def from_address(live: LiveServer, address: str) -> httpx.Client:
    return httpx.Client(base_url=live.url, timeout=30, transport=httpx.HTTPTransport(local_address=address))


def test_wrong_keys_are_401_then_429_for_every_key_of_that_address(guarded: tuple[LiveServer, str]) -> None:
    """The outside sweep sent 4,000 wrong keys, all 401: now 30 are, then 429 with Retry-After, the right
    key from that address too (else a 200 among the 429s tells the guess); another address is served."""
    live, key = guarded
    with from_address(live, "127.0.0.2") as guesser, from_address(live, "127.0.0.3") as other:
        codes = [
            guesser.post("/v1/search", json=QUERY, headers={"X-API-Key": f"ccrk_0000{n:04d}_x"}).status_code
            for n in range(DEFAULT_LIMIT + 10)
        ]
        assert codes == [401] * DEFAULT_LIMIT + [429] * 10
        refused = guesser.post("/v1/search", json=QUERY, headers={"Authorization": f"Bearer {key}"})
        assert refused.status_code == 429 and 1 <= int(refused.headers["retry-after"]) <= 60
        assert refused.json()["detail"][0]["type"] == "rate_limited"
        assert "failed authentications" in refused.json()["detail"][0]["msg"]
        malformed = guesser.post("/v1/search", json=QUERY, headers={"Authorization": "Basic eA=="})
        assert malformed.status_code == 429
        assert other.post("/v1/search", json=QUERY, headers={"X-API-Key": key}).status_code == 200
        # Without a key nothing is guessed: still the 401 asking for one.
        assert guesser.post("/v1/search", json=QUERY).status_code == 401


def test_admin_key_guesses_are_throttled(guarded: tuple[LiveServer, str]) -> None:
    """1,000 admin key guesses went through in 1.5 s: now 30 a minute, then 429, the admin key too."""
    live, _ = guarded
    with from_address(live, "127.0.0.4") as guesser, from_address(live, "127.0.0.5") as admin:
        codes = [
            guesser.post("/v1/admin/reload", headers={"X-API-Key": f"guess-{n}"}).status_code
            for n in range(DEFAULT_LIMIT + 5)
        ]
        assert codes == [401] * DEFAULT_LIMIT + [429] * 5
        assert guesser.post("/v1/admin/reload", headers={"X-API-Key": ADMIN_KEY}).status_code == 429
        assert admin.post("/v1/admin/reload", headers={"X-API-Key": ADMIN_KEY}).status_code == 200


def test_the_admin_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """What is compared is two SHA-256 digests, whatever the lengths: ``compare_digest`` of strings of
    different lengths answers at once, telling a guesser the key's length."""
    compared: list[tuple[int, int]] = []
    real = deps.hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(deps.hmac, "compare_digest", recording)
    assert deps.is_admin_key("x" * 40, "x" * 40)
    assert not deps.is_admin_key("x", "x" * 40) and not deps.is_admin_key("x" * 40, None)
    assert compared == [(32, 32), (32, 32)]


def test_serve_warns_about_a_short_admin_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Warned at start (here the start then stops at the missing model directory)."""
    runner = CliRunner()
    monkeypatch.setenv("CCRK_ADMIN_API_KEY", "hunter2")
    get_settings.cache_clear()  # the process's settings are read once; here the environment changes
    short = runner.invoke(ccrk, ["serve", "--model", str(tmp_path / "none")])
    assert short.exit_code != 0
    assert "CCRK_ADMIN_API_KEY is 7 characters long, under 32" in short.output
    monkeypatch.setenv("CCRK_ADMIN_API_KEY", "k" * 32)
    get_settings.cache_clear()
    long = runner.invoke(ccrk, ["serve", "--model", str(tmp_path / "none")])
    get_settings.cache_clear()
    assert long.exit_code != 0 and "CCRK_ADMIN_API_KEY" not in long.output
