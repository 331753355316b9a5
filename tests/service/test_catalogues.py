"""Several indexes in one process (``extra_indexes``, ``ccrk serve --index-name a,b,c``): one model in memory
for all; ``/v1/indexes/{name}/...`` searches, image searches and similar items of that index only; the
unprefixed routes stay the default index's; a new version of any served index is swapped in; 404 for an
index not served, 422 for a name that is none."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ccrk_settings import settings_with
from service.runtime import served_index_names
from store.errors import IndexUnreachableError
from store.opening import open_version
from tests.fixtures import Catalogue, LiveServer, make_settings, write_version

SHOPS = {"shop": range(0, 20), "shopb": range(20, 40), "shopc": range(40, 60)}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, catalogue: Catalogue) -> Path:
    root = tmp_path_factory.mktemp("catalogues")
    for name, rows in SHOPS.items():
        write_version(root, catalogue, rows=list(rows), name=name)
    return root


@pytest.fixture(scope="module")
def three(root: Path) -> Iterator[LiveServer]:
    with LiveServer(make_settings(root, extra_indexes=["shopb", "shopc"])) as live:
        yield live


def ids_of(response: httpx.Response) -> set[str]:
    assert response.status_code == 200, response.text
    return {hit["id"] for hit in response.json()["results"]}


def test_each_index_answers_from_its_own_items(three: LiveServer, catalogue: Catalogue) -> None:
    runtime = three.app.state.runtime
    # One model for the three: every index's facade holds the one pipeline (and its encoder).
    facades = [runtime.catalogue(name) for name in SHOPS]
    assert len({id(f.pipeline) for f in facades}) == 1 and len({id(f.pipeline.encoder) for f in facades}) == 1
    assert len({id(f.holder) for f in facades}) == 3
    ids = catalogue.ids()
    with three.client() as client:
        for name, rows in SHOPS.items():
            own = {ids[r] for r in rows}
            record = catalogue.records[rows[3]]
            query = {"query": record.captions["en"][0], "lang": "en", "top_k": 20}
            found = ids_of(client.post(f"/v1/indexes/{name}/search", json=query))
            assert found == own  # top 20 of a 20-item index: all of its items, none of another's
            with open(record.image, "rb") as fh:
                data = fh.read()
            image = client.post(
                f"/v1/indexes/{name}/search/image",
                files={"file": ("q.png", data, "image/png")},
                data={"top_k": "3"},
            )
            assert image.status_code == 200 and image.json()["results"][0]["id"] == record.id
            similar = client.post(f"/v1/indexes/{name}/items/{record.id}/similar", json={"top_k": 5})
            assert ids_of(similar) <= own
        default = ids_of(client.post("/v1/search", json={"query": "a bag", "top_k": 20}))
        assert default == {ids[r] for r in SHOPS["shop"]}
        # An item of shop is unknown to shopb.
        assert client.post(f"/v1/indexes/shopb/items/{ids[0]}/similar", json={}).status_code == 404

        missing = client.post("/v1/indexes/nope/search", json={"query": "bag"})
        assert missing.status_code == 404 and missing.json()["detail"][0]["loc"] == ["path", "name"]
        bad = client.post("/v1/indexes/..%2Fx/search", json={"query": "bag"})
        assert bad.status_code in (404, 422)
        assert client.post("/v1/indexes/-x/search", json={"query": "bag"}).status_code == 422

        ready = client.get("/readyz")  # ready once every served index has a version, each named
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        versions = ready.json()["indexes"]
        assert set(versions) == set(SHOPS) and all(versions.values())
        assert versions["shop"] == ready.json()["index_version"]

        metrics = client.get("/metrics").text
        for name, rows in SHOPS.items():
            assert f'ccrk_catalogue_items{{index="{name}"}} {float(len(rows))}' in metrics


def test_each_indexs_hits_link_to_its_own_images(three: LiveServer, catalogue: Catalogue) -> None:
    """A hit of an extra index links to that index's image route (a link to ``/v1/images`` answered 404 for
    its ids, or another shop's photo of the same id), which serves the item's file and thumbnails."""
    ids = catalogue.ids()
    with three.client() as client:
        for name, base in (("shop", "/v1/images"), ("shopb", "/v1/indexes/shopb/images")):
            rows = SHOPS[name]
            body = client.post(f"/v1/indexes/{name}/search", json={"query": "a bag", "top_k": 3}).json()
            for hit in body["results"]:
                assert hit["image_url"] == f"{base}/{hit['id']}"
                record = catalogue.records[ids.index(hit["id"])]
                got = client.get(hit["image_url"])
                assert got.status_code == 200 and got.content == record.image.read_bytes()
                assert client.get(f"{base}?id={hit['id']}").content == got.content
                thumb = client.get(hit["image_url"], params={"size": 32})
                assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
            if name != "shop":  # its items are unknown to the default index's route
                assert client.get(f"/v1/images/{ids[rows[0]]}").status_code == 404
        assert client.get(f"/v1/indexes/nope/images/{ids[0]}").status_code == 404


def test_a_new_version_of_an_extra_index_is_swapped_in(
    three: LiveServer, root: Path, catalogue: Catalogue
) -> None:
    ids = catalogue.ids()
    version = write_version(root, catalogue, rows=list(range(40, 50)), name="shopc")
    deadline = time.monotonic() + 20
    with three.client() as client:
        while True:
            found = ids_of(client.post("/v1/indexes/shopc/search", json={"query": "a lamp", "top_k": 20}))
            if found == {ids[r] for r in range(40, 50)}:
                break
            assert time.monotonic() < deadline, "shopc's new version not served"
            time.sleep(0.1)
        assert three.app.state.runtime.holders["shopc"].served.version == version
        assert len(ids_of(client.post("/v1/indexes/shopb/search", json={"query": "lamp", "top_k": 20}))) == 20


def test_all_means_every_index_under_the_root(root: Path) -> None:
    settings = settings_with({"index_root": root, "index_name": "shopb", "extra_indexes": ["*"]})
    assert served_index_names(settings) == ("shopb", "shop", "shopc")
    settings = settings_with({"index_root": root, "index_name": "shop", "extra_indexes": "shopc,shopc"})
    assert served_index_names(settings) == ("shop", "shopc")


def test_readiness_waits_for_an_extra_index_that_may_still_load_not_one_that_gave_up(root: Path) -> None:
    """A process serving several indexes is not ready while an extra index may still load (its shards out
    of reach: tried again at each poll), as Ray's health check (``Runtime.loading``); an extra index whose
    loading gave up (none published) is named in ``detail`` with its version null, and the process is
    ready all the same, the other indexes answering."""
    live = LiveServer(make_settings(root, extra_indexes=["shopb", "nowhere", "shopc"]))
    runtime = live.app.state.runtime
    unreachable = {"shopc"}

    def opener(index_root: Path, name: str, version: str | None = None, **kwargs: Any) -> Any:
        if name in unreachable:
            raise IndexUnreachableError("shard deployments still starting")
        return open_version(index_root, name, version, **kwargs)

    runtime.index_opener = opener
    with live, live.client() as client:
        ready = client.get("/readyz")
        body = ready.json()
        assert ready.status_code == 503 and body["status"] == "unavailable", body
        assert (
            body["indexes"]["nowhere"] is None
            and body["indexes"]["shopc"] is None
            and body["indexes"]["shopb"]
        )
        assert body["detail"].startswith("nowhere: ") and "shopc: " in body["detail"]
        assert client.post("/v1/indexes/shopb/search", json={"query": "a bag"}).status_code == 200
        unreachable.clear()
        deadline = time.monotonic() + 10
        while runtime.holders["shopc"].served is None:  # the live poller loads it (check here races it)
            assert time.monotonic() < deadline, "shopc not served once its shards answer"
            time.sleep(0.05)
        ready = client.get("/readyz")
        body = ready.json()
        assert ready.status_code == 200 and body["status"] == "ready", body
        assert body["indexes"]["nowhere"] is None and body["indexes"]["shopc"]
        assert body["detail"].startswith("nowhere: ") and "shopc" not in body["detail"]
        assert runtime.loading() == []
        assert client.post("/v1/indexes/nowhere/search", json={"query": "a bag"}).status_code == 503


def test_an_index_published_after_the_start_is_served_with_all(tmp_path: Path, catalogue: Catalogue) -> None:
    """``*`` serves every index under the root, one published after the start too: it is served within a
    poll, by the processes already running (before, only by those started after it), its image uploads
    bounded as the others'; a new index that cannot load keeps the process ready and answers 404."""
    from service.app import ImageSearchPaths

    ids = catalogue.ids()
    write_version(tmp_path, catalogue, rows=list(range(0, 20)), name="shop")
    with LiveServer(make_settings(tmp_path, extra_indexes=["*"])) as live, live.client() as client:
        runtime = live.app.state.runtime
        query = {"query": "a lamp", "top_k": 20}
        assert client.post("/v1/indexes/late/search", json=query).status_code == 404
        assert "/v1/indexes/late/search/image" not in ImageSearchPaths(runtime)
        broken = tmp_path / "broken"
        broken.mkdir()
        (broken / "CURRENT").write_text("v-gone\n")  # names a version that is not there
        write_version(tmp_path, catalogue, rows=list(range(20, 40)), name="late")
        deadline = time.monotonic() + 20
        while (found := client.post("/v1/indexes/late/search", json=query)).status_code == 404:
            assert time.monotonic() < deadline, "the new index was not served"
            time.sleep(0.1)
        assert ids_of(found) == {ids[r] for r in range(20, 40)}
        assert "/v1/indexes/late/search/image" in ImageSearchPaths(runtime)
        record = catalogue.records[25]
        with open(record.image, "rb") as fh:
            image = client.post(
                "/v1/indexes/late/search/image", files={"file": ("q.png", fh.read(), "image/png")}
            )
        assert image.status_code == 200 and image.json()["results"][0]["id"] == record.id
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert set(ready.json()["indexes"]) == {"shop", "late"}
        assert client.post("/v1/indexes/broken/search", json=query).status_code == 404
        assert runtime.index_names == ("shop", "late")


def test_the_poller_outlives_a_new_index_that_fails_to_join(
    tmp_path: Path, catalogue: Catalogue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``*``, a new index whose facade cannot be set up stays joining (not dropped, closed at the end)
    and is tried again at each poll; the poller goes on, swapping new versions of the other indexes in, and
    serves the index once it can."""
    write_version(tmp_path, catalogue, rows=list(range(0, 20)), name="shop")
    with LiveServer(make_settings(tmp_path, extra_indexes=["*"])) as live, live.client() as client:
        runtime = live.app.state.runtime
        real = runtime._add_facade
        tries: list[str] = []
        broken = True

        def add_facade(name: str, holder: Any) -> None:
            tries.append(name)
            if broken:
                raise RuntimeError("facade setup failed")
            real(name, holder)

        monkeypatch.setattr(runtime, "_add_facade", add_facade)
        write_version(tmp_path, catalogue, rows=list(range(20, 40)), name="late")
        deadline = time.monotonic() + 20
        while len(tries) < 2:  # tried again at the next poll: the poller is alive
            assert time.monotonic() < deadline, f"the poller stopped after {tries}"
            time.sleep(0.05)
        assert "late" in runtime._joining and "late" not in runtime.index_names
        newer = write_version(tmp_path, catalogue, rows=list(range(0, 30)), name="shop")
        while runtime.holders["shop"].served.version != newer:  # still hot-swapping
            assert time.monotonic() < deadline, "the default index was not swapped"
            time.sleep(0.05)
        broken = False
        query = {"query": "a lamp", "top_k": 20}
        while client.post("/v1/indexes/late/search", json=query).status_code == 404:
            assert time.monotonic() < deadline, "the new index was not served"
            time.sleep(0.05)
        assert runtime.index_names == ("shop", "late") and not runtime._joining


def test_a_binary_current_of_an_extra_index_neither_stops_the_start_nor_answers_500(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    """An extra index whose CURRENT is not UTF-8 text is unreadable: the process starts (the default index
    answers), /readyz names the read failure, and an admin reload of it answers 409 with it, not 500 (as
    one of the default index once its CURRENT turns binary: the served version keeps answering)."""
    write_version(tmp_path, catalogue, rows=list(SHOPS["shop"]), name="shop")
    write_version(tmp_path, catalogue, rows=list(SHOPS["shopb"]), name="shopb")
    (tmp_path / "shopb" / "CURRENT").write_bytes(b"\xff\xfe\x00garbage")
    with LiveServer(make_settings(tmp_path, extra_indexes=["shopb"])) as live, live.client() as client:
        assert client.post("/v1/search", json={"query": "a bag"}).status_code == 200
        body = client.get("/readyz").json()
        assert body["indexes"]["shopb"] is None and "not UTF-8" in body["detail"], body
        reload = client.post(
            "/v1/admin/reload", params={"index": "shopb"}, headers={"x-api-key": "test-admin-key"}
        )
        assert reload.status_code == 409, reload.text
        assert "not UTF-8" in reload.text
        (tmp_path / "shop" / "CURRENT").write_bytes(b"\xc3\x28")  # the default index's, once served
        reload = client.post("/v1/admin/reload", headers={"x-api-key": "test-admin-key"})
        assert reload.status_code == 409 and "not UTF-8" in reload.text, reload.text
        assert client.post("/v1/search", json={"query": "a bag"}).status_code == 200  # still serving
