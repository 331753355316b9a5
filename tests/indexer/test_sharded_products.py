"""Products in sharded versions: the product channels live once beside the shards, over the global rows,
calibrated on the whole catalogue; the sharded version answers hybrid, text and image searches (and
explain, sort, "more like this", search by photo) as the unsharded build of the same catalogue does;
``verify`` covers the channel files; ``delete`` masks a product in every channel; ``add`` extends them
over the moved global rows, and a failed ``add`` publishes nothing. The shipped demo model, real files,
real uvicorn; ``ccrk index build --shards 2 --text-fields`` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import indexer.sharded
from ccrk_cli.main import app
from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from indexer.build import add, build, delete
from indexer.errors import BuildError
from model.runtime import Encoder
from monitoring.probe import index_searcher, run_probes
from monitoring.probe_set import probes_from_captions
from service.cluster.remote_index import RemoteShardedIndex, remote_opener
from service.cluster.shard import ShardServer
from store.layout import builds_dir, index_dir
from store.opening import open_version
from store.products.channels import PRODUCTS_FILE, TEXT_OWNERS, default_mode, has_product_channels
from store.shards.sharded import ShardedIndex
from store.verify import verify_version
from store.version.reader import IndexVersion
from store.version.versions import current_version, list_versions
from tests.fixtures import LiveServer, make_settings
from tests.indexer.test_products_build import PRODUCTS, _manifest


def product_answers(client: Any, recs: list[dict], prefix: str = "") -> dict[str, list]:
    """What a service answers on a product version: (id, score[, match]) per hit, per request (hybrid, text
    and image modes, explain, sort, "more like this", search by photo). ``prefix``: the served index's
    routes (``/v1/indexes/NAME``), else the default index's. Photo links are checked to name the index's
    image route and kept relative to it (the same answers from another index's routes compare equal)."""
    search, by_photo = (
        (f"{prefix}/search", f"{prefix}/search/image") if prefix else ("/v1/search", "/v1/search/image")
    )
    base = f"{prefix}/images" if prefix else "/v1/images"

    def relative(link: str) -> str:
        assert link.startswith(base + "/") or link.startswith(base + "?"), (link, base)
        return link[len(base) :]

    similar_of = f"{prefix or '/v1'}/items/prod-3/similar"
    out: dict[str, list] = {}
    queries = [recs[3]["title"], recs[7]["title@de"], "red", "a yellow umbrella", recs[11]["description"]]
    for q in queries:
        for mode in ("hybrid", "text", "image"):
            body = client.post(search, json={"query": q, "mode": mode, "top_k": 10}).json()
            assert body["mode"] == mode, body
            out[f"{mode}:{q}"] = [(h["id"], h["score"], h["match"]) for h in body["results"]]
    explained = client.post(search, json={"query": recs[3]["title"], "top_k": 5, "explain": True})
    top = explained.json()["results"][0]
    assert top["id"] == "prod-3" and top["explain"]["channels"]["lexical"]["rank"] == 0
    assert len(top["images"]) == 2
    hits = explained.json()["results"]
    for h in hits:
        h["explain"]["image_url"] = relative(h["explain"]["image_url"])
    out["explain"] = [(h["id"], h["score"], h["explain"]) for h in hits]
    out["images"] = [(h["id"], relative(h["image_url"]), [relative(u) for u in h["images"]]) for h in hits]
    body = {"query": "umbrella", "min_score": -1.0, "top_k": 10, "sort": {"field": "price", "order": "asc"}}
    by_price = client.post(search, json=body).json()["results"]
    assert [h["metadata"]["price"] for h in by_price] == sorted(h["metadata"]["price"] for h in by_price)
    out["sort"] = [(h["id"], h["metadata"]["price"]) for h in by_price]
    similar = client.post(similar_of, json={"top_k": 5}).json()["results"]
    out["similar"] = [(h["id"], h["score"]) for h in similar]
    with open(recs[5]["paths"][1], "rb") as fh:
        up = client.post(by_photo, files={"file": ("q.png", fh, "image/png")}, data={"top_k": "3"})
    out["by photo"] = [(h["id"], h["score"]) for h in up.json()["results"]]
    assert out["by photo"][0][0] == "prod-5"
    return out


def _answers(root: Path, name: str, recs: list[dict], opener: Any = None) -> dict[str, list]:
    """``product_answers`` of the service on a version, and the second photo of a hit served. ``opener``:
    the index holder's (the Ray ingress's ``remote_opener``)."""
    server = LiveServer(make_settings(root, index_name=name))
    server.app.state.runtime.index_opener = opener
    with server as live, live.client() as client:
        out = product_answers(client, recs)
        second = client.get("/v1/images" + out["images"][0][2][1])
        assert second.status_code == 200 and second.content == Path(recs[3]["paths"][1]).read_bytes()
    return out


def _same(got: dict[str, list], want: dict[str, list]) -> None:
    assert got.keys() == want.keys()
    for key, hits in want.items():
        mine = got[key]
        assert [h[0] for h in mine] == [h[0] for h in hits], key
        for a, b in zip(mine, hits, strict=True):
            for x, y in zip(a[1:], b[1:], strict=True):
                if isinstance(y, float):
                    assert x == pytest.approx(y, abs=1e-5), key
                elif isinstance(y, dict):  # explain: the channels' ranks and scores
                    assert json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True) or _close(x, y), key
                else:
                    assert x == y, key


def _close(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-5
    return a == b


def test_a_sharded_product_version_answers_as_the_unsharded_one(
    settings: Settings, catalogue: Path, tmp_path: Path, encoder: Encoder
) -> None:
    products = settings.model_copy(update={"text_fields": ["title", "description"]})
    manifest = _manifest(catalogue, tmp_path)
    recs = [json.loads(line) for line in manifest.read_text().splitlines()]
    build("one", [manifest], settings=products)
    sharded = products.model_copy(update={"index_shards": 2})
    report = build("shards", [manifest], settings=sharded)
    root = settings.index_root
    assert report.published and report.index_shards == 2 and report.items_indexed == PRODUCTS
    assert verify_version(root, "shards", model_dir=DEFAULT_MODEL_DIR) == []
    with open_version(root, "one") as one, open_version(root, "shards") as many:
        assert isinstance(one, IndexVersion) and isinstance(many, ShardedIndex)
        assert one.products is not None and many.products is not None
        # The channels beside the shards, over the global rows; each shard holds the first photos only.
        assert has_product_channels(many.path) and not any(has_product_channels(s.path) for s in many.shards)
        assert many.manifest.checksums and PRODUCTS_FILE in many.manifest.checksums
        a, b = one.products.info, many.products.info
        assert (b.photos, b.texts, b.fields) == (2 * PRODUCTS, 3 * PRODUCTS, ["title", "description"])
        assert (a.photos, a.texts, a.language_counts) == (b.photos, b.texts, b.language_counts)
        # The same fusion, calibrated on the same pseudo-queries of the whole catalogue.
        assert a.fusion["method"] == b.fusion["method"]
        assert (
            _close(a.fusion, b.fusion) and a.calibration["pseudo_queries"] == b.calibration["pseudo_queries"]
        )
        # A product's photos and texts are the same vectors at its global row.
        for item_row in range(PRODUCTS):
            item_id = f"prod-{item_row}"
            r1, r2 = one.row_of(item_id), many.row_of(item_id)
            assert r1 is not None and r2 is not None
            for c1, c2 in (
                (one.products.photos, many.products.photos),
                (one.products.texts, many.products.texts),
            ):
                v1 = np.asarray(c1.vectors[c1.owners == r1])
                v2 = np.asarray(c2.vectors[c2.owners == r2])
                np.testing.assert_allclose(v2, v1, atol=1e-6)
            assert one.products.photo_paths([r1])[r1] == many.products.photo_paths([r2])[r2]
        row3 = many.row_of("prod-3")
        # The quality gate's probes (hybrid, the version's default mode) measure the same on both.
        cats = [json.loads(line) for line in (catalogue / "test.jsonl").read_text().splitlines()]
        probes = probes_from_captions(
            [(f"prod-{i}", cats[2 * i]["captions"]) for i in range(PRODUCTS)], n=10, languages=["en", "de"]
        )
        assert default_mode(many.products) == "hybrid"
        measured = [
            run_probes(probes, index_searcher(opened, encoder, mode="hybrid"), depth=10)
            for opened in (one, many)
        ]
        assert measured[0]["recall_at_10_mean"] > 0.5
        for lang, figures in measured[0]["per_language"].items():  # latencies aside
            same = {k: v for k, v in figures.items() if not k.startswith("latency")}
            assert {k: measured[1]["per_language"][lang][k] for k in same} == same
    want = _answers(root, "one", recs)
    got = _answers(root, "shards", recs)
    _same(got, want)
    # Ray serving: the shards served apart (``ShardServer``, in this process), the channels in the ingress.
    servers = [ShardServer(str(root), "shards", i) for i in range(2)]
    remote = remote_opener(_in_process(servers), 2, open_version)
    _same(_answers(root, "shards", recs, remote), want)
    assert all(s.loaded() == [current_version(root, "shards")] for s in servers)  # served through them

    # ``delete``: the product gone from every channel, the channel files taken over unchanged.
    before = current_version(root, "shards")
    delete("shards", ["prod-3"], settings=sharded)
    assert verify_version(root, "shards") == []
    vdir = index_dir(root, "shards") / current_version(root, "shards")
    assert (vdir / TEXT_OWNERS).stat().st_ino == (
        index_dir(root, "shards") / before / TEXT_OWNERS
    ).stat().st_ino
    with open_version(root, "shards") as local:
        mask = local.live_mask()
        assert mask is not None and np.flatnonzero(~mask).tolist() == [row3]
        servers = [ShardServer(str(root), "shards", i) for i in range(2)]
        with RemoteShardedIndex(local.path, local.manifest, _in_process(servers), shard_count=2) as far:
            assert far.products is not None
            np.testing.assert_array_equal(far.live_mask(), mask)
    for opener in (None, remote_opener(_in_process(servers), 2, open_version)):
        server = LiveServer(make_settings(root, index_name="shards"))
        server.app.state.runtime.index_opener = opener
        with server as live, live.client() as client:
            for mode in ("hybrid", "text", "image"):
                body = {"query": recs[3]["title"], "mode": mode, "top_k": 20}
                hits = client.post("/v1/search", json=body).json()["results"]
                assert "prod-3" not in [h["id"] for h in hits] and len(hits) == PRODUCTS - 1
            similar = client.post("/v1/items/prod-4/similar", json={"top_k": 20}).json()["results"]
            assert "prod-3" not in [h["id"] for h in similar]


def _product(opened: Any, item_id: str) -> tuple[np.ndarray, list[str], list[tuple]]:
    """One product's photo vectors, photo paths and text values (field, language, text) in a version."""
    row = opened.row_of(item_id)
    channels = opened.products
    photos = np.asarray(channels.photos.vectors[channels.photos.owners == row])
    found = channels.texts_of(np.flatnonzero(channels.texts.owners == row).tolist())
    return photos, channels.photo_paths([row])[row], [found[r] for r in sorted(found)]


def test_add_extends_the_channels_of_a_sharded_version_after_a_failed_try(
    settings: Settings, catalogue: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ccrk index add`` on a sharded product version. First it fails while it extends the product channels
    (the shards already staged): the typed error surfaces, CURRENT still names the parent, which still
    verifies, and nothing staged stays (the add's encoded work folder is kept for a re-run, as after any
    failure). Run again, it publishes: the items appended to their shards move the later shards' rows;
    every product's photos and text values end up at its new row, as a full build of the whole catalogue
    has them, and the added and the moved products are found."""
    products = settings.model_copy(update={"text_fields": ["title", "description"], "index_shards": 2})
    manifest = _manifest(catalogue, tmp_path)
    lines = manifest.read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    first = tmp_path / "first.jsonl"
    first.write_text("\n".join(lines[:15]) + "\n")
    root = settings.index_root
    build("shop", [first], settings=products)
    parent = current_version(root, "shop")
    with open_version(root, "shop") as opened:
        before = {i: opened.row_of(f"prod-{i}") for i in range(15)}
    stages: list[Path] = []

    def fail(stage: Path, *args: object, **kwargs: object) -> None:
        stages.append(stage)
        assert (stage / "shard-000").is_dir()  # the shards are staged: only the channels are missing
        raise BuildError("extending the product channels failed")

    with monkeypatch.context() as patched:
        patched.setattr(indexer.sharded, "extend_products", fail)
        with pytest.raises(BuildError, match="extending the product channels failed"):
            add("shop", [manifest], settings=products)
    assert len(stages) == 1 and not stages[0].exists()
    assert current_version(root, "shop") == parent and list_versions(root, "shop") == [parent]
    assert verify_version(root, "shop", model_dir=DEFAULT_MODEL_DIR) == []
    # No staged version, no trash: of the folders under .builds only the add's work folder is left.
    left = sorted(p.name for p in builds_dir(root, "shop").iterdir() if p.is_dir())
    assert [name for name in left if not name.startswith("add-")] == [], left
    with open_version(root, "shop") as opened:
        assert opened.version == parent and len(opened) == 15 and opened.products is not None

    report = add("shop", [manifest], settings=products)
    assert report.published and report.items_indexed == PRODUCTS - 15
    assert verify_version(root, "shop", model_dir=DEFAULT_MODEL_DIR) == []
    full = products.model_copy(update={"index_root": tmp_path / "full"})
    build("shop", [manifest], settings=full)
    with open_version(root, "shop") as added, open_version(full.index_root, "shop") as whole:
        assert isinstance(added, ShardedIndex) and added.products is not None
        assert (added.products.info.photos, added.products.info.texts) == (2 * PRODUCTS, 3 * PRODUCTS)
        assert added.products.info.fusion
        for i in range(PRODUCTS):
            mine, theirs = _product(added, f"prod-{i}"), _product(whole, f"prod-{i}")
            np.testing.assert_allclose(mine[0], theirs[0], atol=1e-5)
            assert mine[1:] == theirs[1:]
        moved = sum(added.row_of(f"prod-{i}") != row for i, row in before.items())
        assert 0 < moved < 15  # the second shard's products moved by the items added to the first
    with LiveServer(make_settings(root, index_name="shop")) as live, live.client() as client:
        for i in (17, 2, 12):
            body = client.post("/v1/search", json={"query": recs[i]["title"], "top_k": 3}).json()
            assert body["mode"] == "hybrid" and body["results"][0]["id"] == f"prod-{i}"
            assert len(body["results"][0]["images"]) == 2


def _in_process(servers: list[ShardServer]) -> Any:
    """A ``RemoteShardedIndex`` call answered by shard servers of this process (Ray's handles stand-in)."""

    class Done:
        def __init__(self, value: object) -> None:
            self.value = value

        def result(self, timeout_s: float | None = None) -> object:
            return self.value

    return lambda shard, method, *args: Done(getattr(servers[shard], method)(*args))


def test_cli_builds_and_verifies_a_sharded_product_version(catalogue: Path, tmp_path: Path) -> None:
    """``ccrk index build --shards 2 --text-fields title,description``, ``ccrk index verify``; a channel
    file changed afterwards is caught."""
    manifest = _manifest(catalogue, tmp_path)
    runner = CliRunner(env={"COLUMNS": "250"})
    common = ["--name", "shop", "--index-root", str(tmp_path / "idx")]
    result = runner.invoke(
        app,
        [
            "index",
            "build",
            *common,
            "--threads",
            "1",
            "--workers",
            "0",
            "--shards",
            "2",
            "--text-fields",
            "title,description",
            str(manifest),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "2 shards" in result.output and "(published)" in result.output and "hybrid search" in result.output
    result = runner.invoke(app, ["index", "verify", *common])
    assert result.exit_code == 0, result.output
    base = tmp_path / "idx" / "shop"
    vdir = base / current_version(tmp_path / "idx", "shop")
    owners = np.load(vdir / TEXT_OWNERS)
    owners[[0, -1]] = owners[[-1, 0]]
    np.save(vdir / TEXT_OWNERS, owners)
    result = runner.invoke(app, ["index", "verify", *common])
    assert result.exit_code != 0 and f"{TEXT_OWNERS}: checksum mismatch" in result.output
    problems = verify_version(tmp_path / "idx", "shop")
    assert problems == [f"{TEXT_OWNERS}: checksum mismatch"]
    # A channel file gone is caught too.
    (vdir / PRODUCTS_FILE).unlink()
    assert f"{PRODUCTS_FILE}: missing" in verify_version(tmp_path / "idx", "shop")
