"""API keys (``service.keys``, ``ccrk keys``): stored hashed only, the key printed once as the last line;
401 without or with a bad key where one is required, 403 for a key of another index or scope; Bearer and
X-API-Key; a revoked or rotated key refused within a second, by a live server and by both processes of
``ccrk serve --workers 2``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from ccrk_cli.main import app as ccrk
from service.keys import KEYS_FILE, KeyRing, KeyStore, KeyStoreError, key_id_of
from tests.fixtures import Catalogue, LiveServer, make_settings, write_version
from tests.service.conftest import REPO, free_port
from tests.service.test_workers import wait_for

runner = CliRunner()
QUERY = {"query": "red shoes", "top_k": 3}


def cli(*args: str) -> list[str]:
    result = runner.invoke(ccrk, ["keys", *args])
    assert result.exit_code == 0, result.output
    return result.output.strip().splitlines()


@pytest.fixture(scope="module")
def shops(tmp_path_factory: pytest.TempPathFactory, catalogue: Catalogue) -> Path:
    """Two indexes, shop and shopb, under one root."""
    root = tmp_path_factory.mktemp("shops")
    write_version(root, catalogue, rows=list(range(30)))
    write_version(root, catalogue, rows=list(range(30, 60)), name="shopb")
    return root


@pytest.fixture(scope="module")
def keyed(shops: Path) -> Iterator[LiveServer]:
    """shop (default) and shopb served; search needs a key."""
    settings = make_settings(shops, extra_indexes=["shopb"], search_requires_key=True)
    with LiveServer(settings) as live:
        yield live


def test_keys_are_stored_hashed_and_printed_once(tmp_path: Path) -> None:
    lines = cli(
        "create",
        "--scope",
        "search",
        "--index",
        "shop",
        "--rate",
        "50/s",
        "--burst",
        "100",
        "--quota",
        "1e6/day",
        "--name",
        "front",
        "--index-root",
        str(tmp_path),
    )
    key = lines[-1]
    key_id = key_id_of(key)
    assert key_id is not None and key.startswith(f"ccrk_{key_id}_") and len(key) > 40
    text = (tmp_path / KEYS_FILE).read_text()
    secret = key.rsplit("_", 1)[1]
    assert key not in text and secret not in text
    (stored,) = json.loads(text)["keys"]
    assert stored["digest"] == hashlib.sha256(key.encode()).hexdigest()
    assert (stored["id"], stored["scope"], stored["indexes"]) == (key_id, "search", ["shop"])
    assert (stored["rate"], stored["burst"], stored["quota_per_day"]) == (50.0, 100, 1_000_000)
    assert oct((tmp_path / KEYS_FILE).stat().st_mode & 0o777) == "0o600"
    listed = cli("list", "--index-root", str(tmp_path))
    assert len(listed) == 1 and key_id in listed[0] and secret not in listed[0]

    rotated = cli("rotate", key_id, "--index-root", str(tmp_path))[-1]
    assert key_id_of(rotated) == key_id and rotated != key
    ring = KeyRing(tmp_path)
    assert ring.lookup(key) is None
    record = ring.lookup(rotated)
    assert record is not None and record.rate == 50.0 and record.indexes == ("shop",)
    assert rotated not in (tmp_path / KEYS_FILE).read_text()
    # Revoked by the key itself; the old key of the id does not name it.
    with pytest.raises(KeyStoreError, match="not the current key"):
        KeyStore(tmp_path).revoke(key)
    cli("revoke", rotated, "--index-root", str(tmp_path))
    assert cli("list", "--index-root", str(tmp_path)) == ["no API keys"]


def test_bad_options_are_refused_naming_them(tmp_path: Path) -> None:
    for args, word in (
        (["--rate", "fast"], "--rate"),
        (["--quota", "1.5/day"], "--quota"),
        (["--scope", "owner"], "scope"),
        (["--index", "../etc"], "index name"),
    ):
        result = runner.invoke(ccrk, ["keys", "create", *args, "--index-root", str(tmp_path)])
        assert result.exit_code == 2 and word in result.output, result.output
    result = runner.invoke(ccrk, ["keys", "revoke", "deadbeef", "--index-root", str(tmp_path)])
    assert result.exit_code == 2 and "no key with id 'deadbeef'" in result.output
    assert not (tmp_path / KEYS_FILE).exists() or json.loads((tmp_path / KEYS_FILE).read_text())["keys"] == []


def test_401_403_and_both_headers(keyed: LiveServer, shops: Path) -> None:
    store = KeyStore(shops)
    _, shop_key = store.create("search", ["shop"])
    _, admin_key = store.create("admin", [])
    with keyed.client() as client:
        missing = client.post("/v1/search", json=QUERY)
        assert missing.status_code == 401 and missing.json()["detail"][0]["type"] == "unauthorized"
        assert missing.headers["www-authenticate"] == "ApiKey"
        wrong = client.post("/v1/search", json=QUERY, headers={"X-API-Key": shop_key[:-2] + "xx"})
        assert wrong.status_code == 401 and wrong.json()["detail"][0]["loc"] == ["header", "x-api-key"]
        basic = client.post("/v1/search", json=QUERY, headers={"Authorization": "Basic abc"})
        assert basic.status_code == 401 and basic.json()["detail"][0]["loc"] == ["header", "authorization"]

        bearer = {"Authorization": f"Bearer {shop_key}"}
        assert client.post("/v1/search", json=QUERY, headers=bearer).status_code == 200
        assert client.post("/v1/search", json=QUERY, headers={"X-API-Key": shop_key}).status_code == 200
        assert client.post("/v1/indexes/shop/search", json=QUERY, headers=bearer).status_code == 200
        # A key of shop on shopb: 403, whichever route names it.
        other = client.post("/v1/indexes/shopb/search", json=QUERY, headers=bearer)
        assert other.status_code == 403 and "'shopb'" in other.json()["detail"][0]["msg"]
        item = "/v1/indexes/shopb/items/x/similar"
        assert client.post(item, json={}, headers=bearer).status_code == 403
        # A search key is no admin key; an admin key is.
        assert client.post("/v1/admin/reload", headers=bearer).status_code == 403
        admin = {"X-API-Key": admin_key}
        assert client.post("/v1/admin/reload", headers=admin).status_code == 200
        reloaded = client.post("/v1/admin/reload", headers=admin, params={"index": "shopb"})
        assert reloaded.status_code == 200 and reloaded.json()["changed"] is False
        unknown = client.post("/v1/admin/reload", headers=admin, params={"index": "nope"})
        assert unknown.status_code == 404 and unknown.json()["detail"][0]["loc"] == ["query", "index"]
        assert client.post("/v1/indexes/shopb/search", json=QUERY, headers=admin).status_code == 200
        # The configured admin key keeps working for both.
        legacy = {"X-API-Key": "test-admin-key"}
        assert client.post("/v1/admin/reload", headers=legacy).status_code == 200
        assert client.post("/v1/search", json=QUERY, headers=legacy).status_code == 200


def test_an_admin_key_of_one_index_administers_that_index_only(keyed: LiveServer, shops: Path) -> None:
    _, shopb_admin = KeyStore(shops).create("admin", ["shopb"])
    headers = {"X-API-Key": shopb_admin}
    with keyed.client() as client:
        own = client.post("/v1/admin/reload", headers=headers, params={"index": "shopb"})
        assert own.status_code == 200
        for params in ({}, {"index": "shop"}):  # the default index, by default or by name
            other = client.post("/v1/admin/reload", headers=headers, params=params)
            assert other.status_code == 403 and other.json()["detail"][0]["loc"] == ["query", "index"]


def test_a_keys_file_with_a_bad_rate_is_refused_naming_it(tmp_path: Path) -> None:
    """A hand-edited rate that is not a positive number (NaN, inf, 0) never reaches the bucket arithmetic."""
    store = KeyStore(tmp_path)
    store.create("search", [])
    path = tmp_path / KEYS_FILE
    for bad in (float("nan"), float("inf"), 0.0):
        data = json.loads(path.read_text())
        data["keys"][0]["rate"] = bad
        path.write_text(json.dumps(data))  # NaN and Infinity as Python's json writes (and reads) them
        with pytest.raises(KeyStoreError, match="rate"):
            KeyStore(tmp_path).records()


def test_a_revoked_key_is_refused_within_a_second(keyed: LiveServer, shops: Path) -> None:
    store = KeyStore(shops)
    record, key = store.create("search", [])
    headers = {"Authorization": f"Bearer {key}"}
    with keyed.client() as client:
        assert client.post("/v1/search", json=QUERY, headers=headers).status_code == 200
        store.revoke(record.id)
        time.sleep(1.0)
        assert client.post("/v1/search", json=QUERY, headers=headers).status_code == 401


def test_anonymous_search_when_no_key_is_required(server: LiveServer) -> None:
    with server.client() as client:
        assert client.post("/v1/search", json=QUERY).status_code == 200
        # A key sent is still checked.
        bad = client.post("/v1/search", json=QUERY, headers={"Authorization": "Bearer ccrk_00000000_nope"})
        assert bad.status_code == 401


def test_revocation_reaches_both_worker_processes_of_two_indexes(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    root = tmp_path / "indexes"
    write_version(root, catalogue, rows=list(range(20)))
    write_version(root, catalogue, rows=list(range(20, 30)), name="shopb")
    store = KeyStore(root)
    record, key = store.create("search", ["shop"])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")}
    env.update(
        {
            "CCRK_THREADS": "1",
            "CCRK_SEARCH_WORKERS": "1",
            "CCRK_RERANK": "false",
            "CCRK_SEARCH_REQUIRES_KEY": "true",
            "CCRK_ANN_SAMPLE_RATE": "0",
            "TMPDIR": str(tmp_path),
            "CCRK_HISTORY_DB": str(tmp_path / "history.sqlite"),
        }
    )
    command = [
        str(Path(sys.executable).parent / "ccrk"),
        "serve",
        "--workers",
        "2",
        "--port",
        str(port),
        "--index-root",
        str(root),
        "--index-name",
        "shop,shopb",  # two indexes: shop the default
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(command, env=env, cwd=REPO)
    headers = {"X-API-Key": key}

    def search() -> int:  # a new connection each: the kernel hands it to either process
        return httpx.post(f"{url}/v1/search", json=QUERY, headers=headers, timeout=10).status_code

    try:
        wait_for(
            lambda: [httpx.get(f"{url}/readyz", timeout=10).status_code for _ in range(20)],
            lambda codes: codes == [200] * 20,
            "both processes ready",
            timeout=180,
        )
        pids = {httpx.get(f"{url}/healthz", timeout=10).json()["pid"] for _ in range(40)}
        assert len(pids) == 2
        assert [search() for _ in range(30)] == [200] * 30
        other = httpx.post(f"{url}/v1/indexes/shopb/search", json=QUERY, headers=headers, timeout=10)
        assert other.status_code == 403  # a key of shop on shopb
        _, admin_key = store.create("admin", [])
        found = httpx.post(f"{url}/v1/indexes/shopb/search", json=QUERY, headers={"X-API-Key": admin_key})
        assert found.status_code == 200 and len(found.json()["results"]) == 3
        store.revoke(record.id)
        time.sleep(1.0)
        assert [search() for _ in range(40)] == [401] * 40
        # Both processes answered those (40 new connections, the same two processes alive).
        assert {httpx.get(f"{url}/healthz", timeout=10).json()["pid"] for _ in range(40)} == pids
    finally:
        proc.terminate()
        proc.wait(timeout=60)
