"""``ccrk serve --engine ray`` on a real Ray cluster of three nodes on this machine: a sharded version served
by one Ray Serve deployment per shard behind the service's own app as the ingress answers 50 multilingual
queries over HTTP with the ids `ccrk serve` answers over the same catalogue unsharded, and a sharded product
version (several photos per product, text fields), served by the same app as an extra index with shard
deployments of its own, answers its hybrid, text and image searches, explain and "more like this" as `ccrk
serve` does over the same products unsharded; a replica of every
shard killed, and a whole node removed, under load fail no request; a swap under load never mixes versions
in one answer; ``RemoteShardedIndex`` retries a call whose replica died; product writes through the
cluster show in both ingress replicas when they return and fold into the shard the hash rule names."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from indexer.build import build
from indexer.live_compact import compact
from service.cluster.deployments import INGRESS
from service.cluster.remote_index import RemoteShardedIndex
from service.cluster.serving import shard_counts_of
from service.cluster.shard import ShardServer
from store.live import SqliteChangeLog, changelog_path
from store.live.readers import READERS_FILE
from store.opening import open_version
from store.shards.sharded import ShardedIndex
from store.version.versions import current_version
from synthetic.synth import SynthConfig, generate_catalogue
from tests.fixtures import LiveServer, make_settings
from tests.indexer.test_products_build import _manifest
from tests.indexer.test_sharded_products import _same, product_answers
from tests.ray_cluster import NODE_ARGS, loopback_cluster

pytestmark = [
    pytest.mark.ray,
    # Ray Serve's own config models use pydantic's deprecated Field(extra=...) when serve is imported.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.serve._private.config"),
]

NAME = "sharded"
FLAT = "flat"  # the same catalogue, one unsharded version
SHARDS = 3
SHOP = "shop"  # a sharded product version (photos and text fields), served beside NAME
SHOP_FLAT = "shop-flat"  # the same products, unsharded
SHOP_SHARDS = 2
LATE = "late"  # an unsharded index published while the app runs
QUERIES = [("en", 0), ("de", 5), ("ja", 9), ("fr", 13), ("zh", 21), ("es", 30)]


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines() if line.strip()]


def _build_settings(root: Path, shards: int = SHARDS) -> Settings:
    return Settings(
        model_dir=DEFAULT_MODEL_DIR, backend="onnx", device="cpu", threads=1, index_root=root,
        index_workers=0, index_batch_size=8, shard_size=8, keep_versions=3, index_shards=shards,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sharded_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(index root with a published 3-shard version of 40 products and an unsharded one of the same
    products, the catalogue folder)."""
    folder = tmp_path_factory.mktemp("catalogue")
    generate_catalogue(folder, SynthConfig(seed=0, n_train=0, n_val=0, n_test=40, image_size=64), workers=1)
    root = tmp_path_factory.mktemp("indexes")
    report = build(NAME, [folder / "test.jsonl"], settings=_build_settings(root))
    assert report.published and report.index_shards == SHARDS
    flat = build(FLAT, [folder / "test.jsonl"], settings=_build_settings(root, shards=1))
    assert flat.published and flat.index_shards == 1
    return root, folder


@pytest.fixture(scope="module")
def shop(sharded_root: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """A 2-shard product version of 20 products (2 photos, a title in two languages and a description
    each) and an unsharded one of the same products, under the same root: the manifest's rows."""
    root, folder = sharded_root
    manifest = _manifest(folder, tmp_path_factory.mktemp("shop"))
    for name, shards in ((SHOP, SHOP_SHARDS), (SHOP_FLAT, 1)):
        # No re-rank policy calibration (~1 s a build): its searches are not re-ranked.
        settings = _build_settings(root, shards=shards).model_copy(
            update={"text_fields": ["title", "description"], "rerank_policy_queries": 0}
        )
        report = build(name, [manifest], settings=settings)
        assert report.published and report.index_shards == shards
    return [json.loads(line) for line in manifest.read_text().splitlines()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster(sharded_root: tuple[Path, Path], shop: list[dict]) -> Iterator[tuple[str, Any, Settings]]:
    """Three Ray nodes on 127.0.0.1, the Serve app of the sharded index and of every other index under the
    root (``*``: the product index SHOP, with shard deployments of its own, and the unsharded FLAT and
    SHOP_FLAT, read by the ingress) on a loopback port: (url, cluster, the app's settings)."""
    from ray import serve

    from service.cluster.deployments import ClusterOptions, build_application

    with loopback_cluster(3) as cluster:
        try:
            port = _free_port()
            serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
            settings = make_settings(
                sharded_root[0], index_name=NAME, extra_indexes=["*"], ray_shard_replicas=3,
                ray_shard_cpus=0.25, ray_ingress_cpus=0.5, ray_max_replicas_per_node=1,
            )  # fmt: skip
            options = ClusterOptions.from_settings(settings)
            assert (options.shard_replicas, options.max_replicas_per_node, options.retries) == (3, 1, 2)
            counts = {NAME: SHARDS, SHOP: SHOP_SHARDS, FLAT: 0, SHOP_FLAT: 0}
            assert shard_counts_of(settings) == counts
            serve.run(build_application(settings, counts, options), name="ccrk", route_prefix="/")
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the Serve app did not become ready"
                time.sleep(0.2)
            yield url, cluster, settings
        finally:
            serve.shutdown()


@pytest.fixture(scope="module")
def serve_url(ray_cluster: tuple[str, Any, Settings]) -> str:
    return ray_cluster[0]


def _answers(client: httpx.Client, texts: list[str]) -> list[list[str]]:
    out = []
    for text in texts:
        for body in ({"query": text, "top_k": 10}, {"query": text, "top_k": 5, "rerank": True}):
            response = client.post("/v1/search", json=body)
            assert response.status_code == 200, response.text
            out.append([hit["id"] for hit in response.json()["results"]])
    return out


def test_ray_serve_answers_as_ccrk_serve_unsharded(serve_url: str, sharded_root: tuple[Path, Path]) -> None:
    """50 queries in all ten languages (captions of other products than the one asked for too), re-ranked
    and not: the ids of `ccrk serve` over the unsharded version of the same catalogue, in the same order."""
    root, folder = sharded_root
    recs = _records(folder)
    langs = list(recs[0]["captions"])
    texts = [recs[(7 * i) % len(recs)]["captions"][langs[i % len(langs)]][i // len(recs)] for i in range(50)]
    assert len(set(texts)) == 50 and len(langs) == 10
    filtered = {"query": texts[0], "top_k": 5, "filters": {"category": recs[0]["attributes"]["category"]}}
    with LiveServer(make_settings(root, index_name=FLAT)) as live, live.client() as client:
        want = _answers(client, texts)
        want_filtered = [hit["id"] for hit in client.post("/v1/search", json=filtered).json()["results"]]
    with httpx.Client(base_url=serve_url, timeout=30) as client:
        info = client.get("/v1/index").json()
        assert info["version"] == current_version(root, NAME) and info["count"] == 40
        got = _answers(client, texts)
        response = client.post("/v1/search", json=filtered)
        assert response.status_code == 200, response.text
        got_filtered = [hit["id"] for hit in response.json()["results"]]
        assert client.get(f"/v1/images/{recs[3]['id']}").status_code == 200
    assert len(want) == 100 and all(want) and got == want
    assert want_filtered and got_filtered == want_filtered


def test_a_sharded_product_version_served_on_ray_answers_as_ccrk_serve_unsharded(
    serve_url: str, sharded_root: tuple[Path, Path], shop: list[dict]
) -> None:
    """The product index served beside the default one (``/v1/indexes/shop/...``): its shards are their own
    deployments, its product channels read in the ingress; hybrid, text and image modes (ids, order, match
    labels, scores), explain, photo links, sort, "more like this" and search by photo answer as `ccrk serve`
    over the unsharded build of the same products."""
    root, _ = sharded_root
    with LiveServer(make_settings(root, index_name=SHOP_FLAT)) as live, live.client() as client:
        want = product_answers(client, shop)
    with httpx.Client(base_url=serve_url, timeout=30) as client:
        got = product_answers(client, shop, prefix=f"/v1/indexes/{SHOP}")
        # A hit's second photo, through the product index's own image route on the cluster.
        second = client.get(f"/v1/indexes/{SHOP}/images" + got["images"][0][2][1])
        assert second.status_code == 200 and second.content == Path(shop[3]["paths"][1]).read_bytes()
    assert len(want) == 20 and all(want.values())
    _same(got, want)


class _Died(Exception):
    pass


class _Done:
    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error

    def result(self, timeout_s: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def test_remote_index_equals_sharded_index_and_retries(sharded_root: tuple[Path, Path]) -> None:
    """In one process, shard servers behind a call that fails the first request of every shard as a dead
    replica would: the answers are ShardedIndex's, every call retried once."""
    root, _ = sharded_root
    servers = [ShardServer(str(root), NAME, i) for i in range(SHARDS)]
    failed: set[int] = set()
    calls: list[tuple[int, str]] = []

    def call(shard: int, method: str, *args: Any) -> _Done:
        calls.append((shard, method))
        if shard not in failed:
            failed.add(shard)
            return _Done(error=_Died("replica died"))
        return _Done(getattr(servers[shard], method)(*args))

    version = current_version(root, NAME)
    with open_version(root, NAME) as local:
        remote = RemoteShardedIndex(
            local.path, local.manifest, call, shard_count=SHARDS, retries=1, retry_on=(_Died,)
        )
        assert len(remote) == len(local) and remote.fields == local.fields and remote.version == version
        rng = np.random.default_rng(0)
        q = rng.standard_normal((4, local.manifest.embed_dim)).astype(np.float32)
        for k in (1, 7, 40):
            for a, b in zip(remote.search(q, k), local.search(q, k), strict=True):
                np.testing.assert_array_equal(a, b)
        allowed = np.arange(0, 40, 3)
        np.testing.assert_array_equal(
            remote.search_exact(q, 5, allowed)[1], local.search_exact(q, 5, allowed)[1]
        )
        rows = local.search(q, 10)[1][0]
        assert remote.items(rows) == local.items(rows)
        np.testing.assert_array_equal(remote.rerank_tokens(rows), local.rerank_tokens(rows))
        item_id = local.items([5])[0]["id"]
        assert remote.row_of(item_id) == local.row_of(item_id) == 5
        category = local.items([0])[0]["category"]
        np.testing.assert_array_equal(
            remote.filter_rows({"category": category}), local.filter_rows({"category": category})
        )
        for field in (*sorted(local.fields), "no-such-field"):  # what a product write is checked against
            assert remote.field_kinds(field) == local.field_kinds(field), field
        assert remote.field_kinds("category") == {"text"}
        remote.close()
    assert sum(1 for s, m in calls if m == "open") == SHARDS + SHARDS  # each shard's first call retried once
    assert all(s.loaded() == [version] for s in servers)


class Load:
    """A bounded load loop in a thread: six multilingual searches in turn until the block ends; ``seen``
    holds (index_version, ids) of every answer, ``errors`` every failed request (status or transport)."""

    def __init__(self, url: str, folder: Path) -> None:
        recs = _records(folder)
        self.texts = [recs[i]["captions"][lang][0] for lang, i in QUERIES]
        self.url = url
        self.seen: list[tuple[str, list[str]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            n = 0
            while not self._stop.is_set():
                text = self.texts[n % len(self.texts)]
                n += 1
                try:
                    response = client.post("/v1/search", json={"query": text, "top_k": 40})
                except httpx.HTTPError as exc:  # a failed request, not a dead loop that checks nothing
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                if response.status_code != 200:
                    self.errors.append(f"{response.status_code} {response.text[:300]}")
                    continue
                body = response.json()
                self.seen.append((body["index_version"], [hit["id"] for hit in body["results"]]))


def test_a_killed_shard_replica_fails_no_request(serve_url: str, sharded_root: tuple[Path, Path]) -> None:
    """Each shard has 3 replicas (one per node); one replica of every shard is killed under load: the
    ingress's retry sends each failed call to another replica, so no search fails."""
    import ray

    with Load(serve_url, sharded_root[1]) as load:
        time.sleep(1.0)
        victims = [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if "SERVE_REPLICA" in a["name"] and a["name"].split("#")[1].startswith("shard-")
        ]  # the default index's shards (SHOP's deployments are named shop-shard-...)
        killed = {}
        for name in sorted(victims):
            shard = name.split("#")[1]
            if shard not in killed:
                killed[shard] = name
                ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
        assert len(killed) == SHARDS, victims
        before = len(load.seen)
        time.sleep(3.0)
        assert len(load.seen) > before
    assert not load.errors, load.errors[:3]
    assert all(len(ids) == 40 for _, ids in load.seen)


def test_a_node_removed_under_load_fails_no_request(
    ray_cluster: tuple[str, Any, Settings], sharded_root: tuple[Path, Path]
) -> None:
    """A whole worker node (its raylet and every replica on it) is removed, not gracefully, under a bounded
    load loop: every node holds one replica of every shard (3 replicas, max 1 per node), so each shard keeps
    two on other nodes; the ingress retries the calls that were on the lost node, so no search fails; then
    a node joins again for the tests after. The node removed is one without the ingress (a lost ingress
    replica's requests in flight fail: see the README)."""
    from ray._private import state  # the GCS actor table; ray.util.state needs the dashboard

    url, cluster, _ = ray_cluster
    victim = None
    # The test before killed a replica of every shard: Serve starts their successors in the background, so
    # wait (bounded) until every shard has its 3 replicas alive again before choosing the node to remove.
    deadline = time.monotonic() + 90
    while victim is None:
        replicas = [
            (a["Name"], a["Address"]["NodeID"])
            for a in state.actors().values()
            if a["State"] == "ALIVE" and "SERVE_REPLICA" in a["Name"]
        ]
        ingress_nodes = {node for name, node in replicas if INGRESS in name}
        per_shard: dict[str, set[str]] = {}
        for name, node in replicas:
            if name.split("#")[1].startswith("shard-"):  # the default index's
                per_shard.setdefault(name.split("#")[1], set()).add(node)
        if len(per_shard) == SHARDS and all(len(nodes) == 3 for nodes in per_shard.values()):
            shard_nodes = set.union(*per_shard.values())
            victim = next(
                (node for node in sorted(cluster.worker_nodes, key=lambda n: n.node_id)
                 if node.node_id not in ingress_nodes and node.node_id in shard_nodes),
                None,
            )  # fmt: skip
        if victim is None:
            assert time.monotonic() < deadline, f"replicas not back on every node within 90 s: {replicas}"
            time.sleep(0.5)
    try:
        with Load(url, sharded_root[1]) as load:
            time.sleep(1.0)
            cluster.remove_node(victim, allow_graceful=False)
            before = len(load.seen)
            time.sleep(4.0)
            assert len(load.seen) > before, "no answer after the node was removed"
    finally:
        cluster.add_node(**NODE_ARGS)
        cluster.wait_for_nodes()
    assert not load.errors, load.errors[:3]
    assert len(load.seen) > 10 and all(len(ids) == 40 for _, ids in load.seen)


def _board(root: Path, name: str) -> dict[str, int]:
    """The fresh readers of index ``name``'s reader board (``store.live.readers``): {reader: applied}."""
    with contextlib.closing(sqlite3.connect(root / name / READERS_FILE)) as conn:
        rows = conn.execute("SELECT reader, applied FROM readers WHERE seen_at >= ?", (time.time() - 5,))
        return {str(reader): int(applied) for reader, applied in rows}


def test_writes_through_the_ingress_show_in_every_replica_and_fold_into_the_owning_shards(
    ray_cluster: tuple[str, Any, Settings], sharded_root: tuple[Path, Path], shop: list[dict]
) -> None:
    """The product index SHOP (2 shard deployments, 2 ingress replicas): a price change, a delete and a new
    product with a photo, written through the cluster's HTTP proxy with ``wait=true``, are on the reader
    board of both ingress replicas when the write returns, and every search after it (whichever replica
    answers) shows them. ``ccrk index compact`` then folds the patch and the delete into the shard the hash
    rule names (``Sharding.owner``) and the new product by a build of the catalogue (into its owner shard),
    the log is empty, and the ingress swaps to that version with the same answers."""
    url, _, settings = ray_cluster
    root, _ = sharded_root
    with _ingress_replicas(settings, 2):
        _write_and_fold(url, root, settings, shop)


@contextlib.contextmanager
def _ingress_replicas(settings: Settings, count: int) -> Iterator[None]:
    """The app with ``count`` ingress replicas from now on (an in-place update: the shard replicas stay;
    after the node-removal test, which needs a worker node without an ingress)."""
    from ray import serve

    from service.cluster.deployments import ClusterOptions, build_application

    def deploy(replicas: int) -> None:
        scaled = settings.model_copy(update={"ray_ingress_replicas": replicas})
        app = build_application(scaled, shard_counts_of(scaled), ClusterOptions.from_settings(scaled))
        serve.run(app, name="ccrk", route_prefix="/")

    deploy(count)
    yield


def _write_and_fold(url: str, root: Path, settings: Settings, shop: list[dict]) -> None:
    admin = {"Authorization": f"Bearer {settings.admin_api_key}"}
    p = f"/v1/indexes/{SHOP}"
    by_price = {"query": shop[0]["title"], "top_k": 30, "mode": "hybrid", "min_score": -1.0,
                "sort": {"field": "price", "order": "asc"}}  # fmt: skip
    title = "Ein leuchtend violetter Regenschirm mit goldenen Sternen"  # not the photo's: text mode finds it
    photo = Path(shop[11]["paths"][0]).read_bytes()
    with httpx.Client(base_url=url, timeout=60) as client:

        def hits(body: dict[str, Any]) -> list[str]:
            answer = client.post(p + "/search", json=body)
            assert answer.status_code == 200, answer.text
            return [h["id"] for h in answer.json()["results"]]

        def by_photo() -> list[str]:
            answer = client.post(p + "/search/image", files={"file": ("q.png", photo, "image/png")})
            assert answer.status_code == 200, answer.text
            return [h["id"] for h in answer.json()["results"]]

        before = hits(by_price)
        assert set(before) == {f"prod-{i}" for i in range(20)}
        cheap, gone = "prod-5", "prod-7"
        receipts = [
            client.patch(p + f"/products/{cheap}", json={"fields": {"price": 0.5}}, headers=admin),
            client.delete(p + f"/products/{gone}", headers=admin),
            client.put(
                p + "/products/new-1",
                json={
                    "fields": {"title@de": title, "price": 1.0, "category": shop[11]["category"]},
                    "photos": [{"data": base64.b64encode(photo).decode()}],
                },
                headers=admin,
            ),
        ]
        for receipt in receipts:
            assert receipt.status_code == 200 and receipt.json()["visible"] is True, receipt.text
        seq = receipts[-1].json()["seq"]
        wrong = client.patch(p + f"/products/{cheap}", json={"fields": {"price": "cheap"}}, headers=admin)
        assert wrong.status_code == 422 and wrong.json()["detail"][0]["loc"] == ["body", "fields", "price"]
        board = _board(root, SHOP)
        assert len(board) == 2 and min(board.values()) >= seq, board  # both ingress replicas applied it
        for _ in range(12):  # the proxy spreads these over both replicas
            ranked = hits(by_price)
            assert ranked[:2] == ["new-1", cheap] or ranked[:2] == [cheap, "new-1"], ranked[:3]
            assert gone not in ranked and len(ranked) == 20
        assert hits({"query": title, "top_k": 3, "mode": "text"})[0] == "new-1"
        assert "new-1" in by_photo()[:2]

        report = compact(SHOP, settings=Settings(index_root=root))
        assert report.published, report.notes
        assert any("by a build of the catalogue" in note for note in report.notes), report.notes
        with open_version(root, SHOP, report.version) as folded:
            assert isinstance(folded, ShardedIndex) and folded.manifest.live_sequence == seq
            assert len(folded.shards) == 2
            for item_id, price in ((cheap, 0.5), ("new-1", 1.0)):
                shard = folded.shards[folded.sharding.owner(item_id)]  # type: ignore[index]
                assert shard.items([shard.row_of(item_id)])[0]["price"] == price
            assert folded.row_of(gone) is None
        with SqliteChangeLog(changelog_path(root, SHOP)) as log:
            assert log.pending() == 0
        deadline = time.monotonic() + 30
        while client.get("/readyz").json()["indexes"].get(SHOP) != report.version:
            assert time.monotonic() < deadline, "the ingress did not swap to the compacted version"
            time.sleep(0.2)
        assert hits(by_price) == ranked
        assert hits({"query": title, "top_k": 3, "mode": "text"})[0] == "new-1"
        assert "new-1" in by_photo()[:2]


def test_a_swap_under_load_never_mixes_versions(serve_url: str, sharded_root: tuple[Path, Path]) -> None:
    root, folder = sharded_root
    before = current_version(root, NAME)
    recs = _records(folder)
    # A new version of the same 40 products minus 4: its answers hold none of them.
    subset = folder / "fewer.jsonl"
    kept = [dict(rec, image=str(folder / rec["image"])) for rec in recs[4:]]
    subset.write_text("".join(json.dumps(rec) + "\n" for rec in kept))
    with Load(serve_url, folder) as load:
        time.sleep(1.0)
        report = build(NAME, [subset], settings=_build_settings(root))
        assert report.published
        after = current_version(root, NAME)
        deadline = time.monotonic() + 30
        while not any(v == after for v, _ in load.seen[-5:]):
            assert time.monotonic() < deadline, f"the ingress did not swap within 30 s: {load.errors[:3]}"
            time.sleep(0.2)
        time.sleep(0.5)
    assert not load.errors, load.errors[:3]
    removed = {recs[i]["id"] for i in range(4)}
    assert {v for v, _ in load.seen} == {before, after}
    for version, ids in load.seen:
        if version == after:
            assert len(ids) == 36 and not removed & set(ids)
        else:
            assert len(ids) == 40


def test_an_unsharded_index_published_after_the_start_is_served_by_the_running_ingress(
    serve_url: str, sharded_root: tuple[Path, Path]
) -> None:
    """``*``: an unsharded index published under the root after the app was deployed is served by the
    ingress replica already running (its poll), with no deployment again; before, only by a replica started
    after it."""
    root, folder = sharded_root
    query = {"query": _records(folder)[7]["captions"]["en"][0], "top_k": 5}
    with httpx.Client(base_url=serve_url, timeout=30) as client:
        assert client.post(f"/v1/indexes/{LATE}/search", json=query).status_code == 404
        report = build(LATE, [folder / "test.jsonl"], settings=_build_settings(root, shards=1))
        assert report.published and report.index_shards == 1
        deadline = time.monotonic() + 30
        while (response := client.post(f"/v1/indexes/{LATE}/search", json=query)).status_code == 404:
            assert time.monotonic() < deadline, "the new index was not served by the running ingress"
            time.sleep(0.2)
        assert response.status_code == 200, response.text
        flat = client.post(f"/v1/indexes/{FLAT}/search", json=query)
        assert [h["id"] for h in response.json()["results"]] == [h["id"] for h in flat.json()["results"]]
        ready = client.get("/readyz").json()
        assert ready["indexes"][LATE] == current_version(root, LATE)


@pytest.mark.exclusive  # a redeploy with searches in flight: their 30 s timeout, not another worker's load
def test_a_version_with_another_shard_count_is_deployed_again(
    ray_cluster: tuple[str, Any, Settings], sharded_root: tuple[Path, Path], shop: list[dict]
) -> None:
    """A rebuild into 2 shards: the running app (3 shard deployments) keeps serving the old version, the
    driver's poll step deploys the app again with 2, and the new version serves; no request fails. The
    product index, deployed again with the app, serves too."""
    from service.cluster.deployments import ClusterOptions
    from service.cluster.serving import redeploy_if_resharded

    url, _, settings = ray_cluster
    root, folder = sharded_root
    before = current_version(root, NAME)
    with Load(url, folder) as load:
        report = build(NAME, [folder / "test.jsonl"], settings=_build_settings(root, shards=2))
        assert report.published and report.index_shards == 2
        after = current_version(root, NAME)
        time.sleep(1.0)
        assert all(v == before for v, _ in load.seen[-3:])  # the 3-shard app cannot open it: the old one
        options = ClusterOptions.from_settings(settings)
        # LATE: published by the test before, when it ran.
        unsharded = {name: 0 for name in (FLAT, SHOP_FLAT, LATE) if (root / name).is_dir()}
        deployed = {NAME: SHARDS, SHOP: SHOP_SHARDS, **unsharded}
        now = {NAME: 2, SHOP: SHOP_SHARDS, **unsharded}
        assert redeploy_if_resharded(settings, deployed, options) == now
        assert redeploy_if_resharded(settings, now, options) == now  # nothing to do
        deadline = time.monotonic() + 60
        while not any(v == after for v, _ in load.seen[-3:]):
            assert time.monotonic() < deadline, f"the 2-shard version was not served: {load.errors[:3]}"
            time.sleep(0.2)
    assert not load.errors, load.errors[:3]
    assert {v for v, _ in load.seen} == {before, after}
    assert all(len(ids) == 40 for v, ids in load.seen if v == after)
    body = {"query": shop[3]["title"], "top_k": 3}
    response = httpx.post(f"{url}/v1/indexes/{SHOP}/search", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["results"][0]["id"] == "prod-3"
