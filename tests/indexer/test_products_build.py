"""Products with several photos and searched text fields: the build writes product channels and calibrates
their fusion; the service answers one hit per product (hybrid, image and text modes), with photos,
explanations, sort and "more like this". The shipped demo model, real files, real uvicorn."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from ccrk_settings import Settings
from indexer.build import add, build, delete
from indexer.fusion_calibration import calibrate
from indexer.products import text_rows
from indexer.sources import read_sources
from model.runtime import Encoder
from monitoring.probe import ProbeError, index_searcher, run_probes
from monitoring.probe_set import probes_from_captions, save_probe_set
from store.layout import index_dir
from store.products.channels import PRODUCTS_FILE, ProductChannels, has_product_channels
from store.products.hybrid import FEATURES, OTHER
from store.verify import verify_version
from store.version.reader import IndexVersion
from store.version.versions import current_version
from synthetic.attributes import ProductAttributes
from synthetic.shop_titles import shop_title
from tests.fixtures import LiveServer, make_settings

PRODUCTS = 20


def _manifest(catalogue: Path, out: Path) -> Path:
    recs = [json.loads(line) for line in (catalogue / "test.jsonl").read_text().splitlines()]
    rows = []
    for i in range(PRODUCTS):
        a, b = recs[2 * i], recs[2 * i + 1]
        rows.append(
            {
                "id": f"prod-{i}",
                "paths": [str(catalogue / a["image"]), str(catalogue / b["image"])],
                "title": a["captions"]["en"][0],
                "title@de": a["captions"]["de"][0],
                "description": a["captions"]["en"][-1],
                "price": 100 - i,
                "category": a["attributes"]["category"],
            }
        )
    path = out / "products.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def product_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"text_fields": ["title", "description"]})


def test_sources_read_paths_and_text_fields(catalogue: Path, tmp_path: Path) -> None:
    items = read_sources([_manifest(catalogue, tmp_path)]).items
    assert len(items) == PRODUCTS and len(items[0].extra_paths) == 1
    assert "paths" not in items[0].fields and items[0].fields["title@de"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "paths": []}) + "\n")
    with pytest.raises(Exception, match="paths"):
        read_sources([bad])


def test_build_and_serve_products(
    product_settings: Settings, catalogue: Path, tmp_path: Path, encoder: Encoder
) -> None:
    settings = product_settings
    manifest = _manifest(catalogue, tmp_path)
    report = build("shop", [manifest], settings=settings)
    assert report.published and report.items_indexed == PRODUCTS
    version = current_version(settings.index_root, "shop")
    vdir = index_dir(settings.index_root, "shop") / version
    assert has_product_channels(vdir)
    info = json.loads((vdir / PRODUCTS_FILE).read_text())
    assert info["photos"] == 2 * PRODUCTS and info["texts"] == 3 * PRODUCTS
    assert info["fusion"]["method"] in ("rrf", "weighted", "logistic")
    assert verify_version(settings.index_root, "shop") == []
    with IndexVersion.open(settings.index_root, "shop") as opened:
        assert opened.products is not None and opened.products.info.photos == 2 * PRODUCTS

    serve = make_settings(settings.index_root, index_name="shop", text_fields=[])
    recs = [json.loads(line) for line in manifest.read_text().splitlines()]
    with LiveServer(serve) as live, live.client() as client:
        body = client.post("/v1/search", json={"query": recs[3]["title"], "top_k": 5, "explain": True}).json()
        assert body["mode"] == "hybrid"
        ids = [h["id"] for h in body["results"]]
        assert len(ids) == len(set(ids)) == 5 and ids[0] == "prod-3"  # its own title: found first
        top = body["results"][0]
        assert len(top["images"]) == 2 and top["explain"]["channels"]["lexical"]["rank"] == 0
        assert top["explain"]["lexical_field"] == "title" and top["explain"]["terms"]
        # The centroid feature: the query against the normalised sum of the product's text embeddings.
        with IndexVersion.open(settings.index_root, "shop") as opened:
            row = opened.row_of("prod-3")
        owners, embeds = np.load(vdir / "text_owners.npy"), np.load(vdir / "text_embeddings.npy")
        total = embeds[owners == row].sum(axis=0)
        query = encoder.encode_text([recs[3]["title"]]).embeds[0]
        expected = float(total @ query / np.linalg.norm(total))
        assert top["explain"]["centroid"] == pytest.approx(expected, abs=1e-4)
        assert top["match"] in ("strong", "weak", "none")
        # Each photo is served: the second one is the second file of the row.
        photo = client.get(top["images"][1])
        assert photo.status_code == 200
        assert photo.content == Path(recs[3]["paths"][1]).read_bytes()
        assert client.get("/v1/images/prod-3?photo=2").status_code == 404
        # Modes: text searches text fields only, image the photos only (cosines); one hit per product.
        text = client.post("/v1/search", json={"query": recs[3]["title"], "mode": "text", "top_k": 3}).json()
        assert text["mode"] == "text" and text["results"][0]["id"] == "prod-3"
        image = client.post("/v1/search", json={"query": "red", "mode": "image", "top_k": 20}).json()
        got = [h["id"] for h in image["results"]]
        assert len(got) == len(set(got)) == PRODUCTS
        scores = [h["score"] for h in image["results"]]
        assert scores == sorted(scores, reverse=True)
        # Relevant, then sorted by price.
        sorted_body = client.post(
            "/v1/search",
            json={
                "query": recs[3]["title"],
                "top_k": 10,
                "min_score": -1.0,
                "sort": {"field": "price", "order": "asc"},
            },
        ).json()
        prices = [h["metadata"]["price"] for h in sorted_body["results"]]
        assert prices == sorted(prices) and len(prices) == 10
        assert (
            client.post(
                "/v1/search", json={"query": "x", "sort": {"field": "price", "order": "up"}}
            ).status_code
            == 422
        )
        # More like this: the item's own photo vectors, itself left out unless asked.
        similar = client.post("/v1/items/prod-3/similar", json={"top_k": 5}).json()
        assert "prod-3" not in [h["id"] for h in similar["results"]] and len(similar["results"]) == 5
        with_self = client.post("/v1/items/prod-3/similar", json={"top_k": 1, "include_self": True}).json()
        assert with_self["results"][0]["id"] == "prod-3" and with_self["results"][0][
            "score"
        ] == pytest.approx(1.0, abs=1e-5)
        assert client.post("/v1/items/nope/similar", json={}).status_code == 404
        # Search by photo: a product's second photo finds that product first.
        with open(recs[5]["paths"][1], "rb") as fh:
            up = client.post(
                "/v1/search/image", files={"file": ("q.png", fh, "image/png")}, data={"top_k": "3"}
            )
        assert up.status_code == 200 and up.json()["results"][0]["id"] == "prod-5"

    # A deleted product is gone from every channel (its photos and text stay in the files until a build).
    delete("shop", ["prod-3"], settings=settings)
    assert verify_version(settings.index_root, "shop") == []
    with LiveServer(serve) as live, live.client() as client:
        for mode in ("hybrid", "text", "image"):
            body = client.post(
                "/v1/search", json={"query": recs[3]["title"], "mode": mode, "top_k": 20}
            ).json()
            assert "prod-3" not in [h["id"] for h in body["results"]] and len(body["results"]) == PRODUCTS - 1
        similar = client.post("/v1/items/prod-4/similar", json={"top_k": 20}).json()
        assert "prod-3" not in [h["id"] for h in similar["results"]]


def test_add_extends_the_product_channels(
    product_settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    """``ccrk index add`` on products: the parent's photos and texts kept as stored, the added products'
    encoded as a full build encodes them, the fusion calibrated again; the added products are found."""
    settings = product_settings
    manifest = _manifest(catalogue, tmp_path)
    rows = manifest.read_text().splitlines()
    first = tmp_path / "first.jsonl"
    first.write_text("\n".join(rows[:15]) + "\n")
    build("shop", [first], settings=settings)
    parent = current_version(settings.index_root, "shop")
    report = add("shop", [manifest], settings=settings)
    assert report.published and report.items_indexed == PRODUCTS - 15
    assert verify_version(settings.index_root, "shop") == []
    full = settings.model_copy(update={"index_root": tmp_path / "full"})
    build("shop", [manifest], settings=full)
    base = index_dir(settings.index_root, "shop")
    with (
        IndexVersion.open(settings.index_root, "shop") as added,
        IndexVersion.open(base.parent, "shop", parent) as before,
        IndexVersion.open(full.index_root, "shop") as whole,
    ):
        new, old, ref = added.products, before.products, whole.products
        assert new is not None and old is not None and ref is not None
        assert (new.info.photos, new.info.texts) == (2 * PRODUCTS, 3 * PRODUCTS)
        assert new.info.fusion and new.info.fields == ["title", "description"]
        k, t = old.info.photos, old.info.texts
        assert np.array_equal(np.asarray(new.photos.vectors[:k]), np.asarray(old.photos.vectors))
        assert np.array_equal(np.asarray(new.texts.vectors[:t]), np.asarray(old.texts.vectors))
        for mine, theirs in ((new.photos, ref.photos), (new.texts, ref.texts)):
            assert np.array_equal(mine.owners, theirs.owners)
            np.testing.assert_allclose(np.asarray(mine.vectors), np.asarray(theirs.vectors), atol=1e-5)
        assert new.texts_of(range(3 * PRODUCTS)) == ref.texts_of(range(3 * PRODUCTS))
        assert new.terms_of(range(3 * PRODUCTS)) == ref.terms_of(range(3 * PRODUCTS))
        # The extended version's term hashes (the coverage feature) equal the full build's.
        assert new._term_hashes is not None
        every = np.arange(3 * PRODUCTS)
        vocab = sorted({t for terms in ref.terms_of(every.tolist()).values() for t in terms})
        np.testing.assert_array_equal(new.presence(every, vocab), ref.presence(every, vocab))
    recs = [json.loads(line) for line in rows]
    with LiveServer(make_settings(settings.index_root, index_name="shop")) as live, live.client() as client:
        body = client.post("/v1/search", json={"query": recs[17]["title"], "top_k": 3}).json()
        assert body["mode"] == "hybrid" and body["results"][0]["id"] == "prod-17"
        assert len(body["results"][0]["images"]) == 2


def test_index_without_products_is_unchanged(settings: Settings, catalogue: Path) -> None:
    """One photo per item and no text fields: no product channels, searched exactly as before."""
    build("plain", [catalogue / "test.jsonl"], settings=settings)
    with IndexVersion.open(settings.index_root, "plain") as opened:
        assert opened.products is None
    serve = make_settings(settings.index_root, index_name="plain")
    with LiveServer(serve) as live, live.client() as client:
        body = client.post("/v1/search", json={"query": "a red chair"}).json()
        assert body["mode"] == "image" and body["results"][0]["images"] is None
        bad = client.post("/v1/search", json={"query": "a red chair", "mode": "text"})
        assert bad.status_code == 422 and "mode" in json.dumps(bad.json())


def test_shop_titles_leave_image_answers_unchanged(
    settings: Settings, catalogue: Path, tmp_path: Path, encoder: Encoder
) -> None:
    """The demo's shop titles (``ccrk data synth --shop-titles de``) make it hybrid; mode image answers
    exactly as the same catalogue built without them; consistency compares hybrid and image."""
    titled = tmp_path / "titled.jsonl"
    lines = []
    for line in (catalogue / "test.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rec["image"] = str(catalogue / rec["image"])
        rec["title"] = shop_title(ProductAttributes.from_dict(rec["attributes"]))
        lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
    titled.write_text("".join(lines))
    build("plain", [catalogue / "test.jsonl"], settings=settings)
    build("titled", [titled], settings=settings.model_copy(update={"text_fields": ["title"]}))
    queries = ["a red mug", "drei gelbe Regenschirme", "un chapeau bleu", "赤いカップ", "striped bag"]
    answers = {}
    for name in ("plain", "titled"):
        with LiveServer(make_settings(settings.index_root, index_name=name)) as live, live.client() as client:
            answers[name] = [
                [
                    (h["id"], round(h["score"], 5))
                    for h in client.post(
                        "/v1/search", json={"query": q, "mode": "image", "top_k": 10}
                    ).json()["results"]
                ]
                for q in queries
            ]
            if name == "titled":
                hybrid = client.post("/v1/search", json={"query": "Regenschirm gestreift", "top_k": 3}).json()
                assert (
                    hybrid["mode"] == "hybrid" and "Regenschirm" in hybrid["results"][0]["metadata"]["title"]
                )
                # The CCRk fusion encoder still re-ranks on top (the head of the fused order).
                body = {"query": "Regenschirm gestreift", "top_k": 5, "rerank": True, "rerank_k": 8}
                reranked = client.post("/v1/search", json=body).json()
                assert reranked["reranked"] is True and reranked["timings_ms"]["rerank"] > 0
                assert all(h["rerank_score"] is not None for h in reranked["results"])
                plain = client.post("/v1/search", json={**body, "rerank": False, "top_k": 8}).json()
                assert {h["id"] for h in reranked["results"]} <= {h["id"] for h in plain["results"]}
                for mode in ("hybrid", "image"):
                    body = {"queries": {"en": "yellow umbrella", "de": "gelber Regenschirm"}, "mode": mode}
                    report = client.post("/v1/consistency", json=body).json()
                    assert report["mode"] == mode and len(report["languages"]) == 2
    assert answers["titled"] == answers["plain"]
    # Probes: hybrid beside image-only (the service's background probes and the dashboard record both).
    recs = [json.loads(line) for line in titled.read_text().splitlines()]
    probes = probes_from_captions(
        [(r["id"], r["captions"]) for r in recs], n=10, languages=["en", "de", "fr"]
    )
    with IndexVersion.open(settings.index_root, "titled") as opened:
        image = run_probes(probes, index_searcher(opened, encoder), depth=20)
        hybrid = run_probes(probes, index_searcher(opened, encoder, mode="hybrid"), depth=20)
        assert set(hybrid["per_language"]) == {"en", "de", "fr"} and hybrid["mrv"] >= 0
        assert image["recall_at_10_mean"] > 0.5 and hybrid["recall_at_10_mean"] > 0.5
    with IndexVersion.open(settings.index_root, "plain") as opened, pytest.raises(ProbeError, match="text"):
        index_searcher(opened, encoder, mode="hybrid")
    probe_file = tmp_path / "probes.jsonl"
    save_probe_set(probes, probe_file)
    serve = make_settings(settings.index_root, index_name="titled", probe_set=probe_file, probe_depth=20)
    with LiveServer(serve) as live, live.client() as client:
        deadline = time.monotonic() + 60
        while "hybrid-table" not in (page := client.get("/dashboard").text) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "hybrid-table" in page and "Hybrid and image-only" in page


def test_useless_channel_gets_a_weight_near_zero(
    product_settings: Settings, catalogue: Path, tmp_path: Path, encoder: Encoder
) -> None:
    """Calibration: with the photos replaced by noise, the image feature's fitted weight falls near zero."""
    settings = product_settings
    build("cal", [_manifest(catalogue, tmp_path)], settings=settings)
    vdir = index_dir(settings.index_root, "cal") / current_version(settings.index_root, "cal")
    items = read_sources([_manifest(catalogue, tmp_path)]).items
    texts, info = text_rows(items, encoder, settings)
    noisy = tmp_path / "noisy"
    shutil.copytree(vdir, noisy)  # copies, not links: the photo arrays are rewritten below
    rng = np.random.default_rng(0)
    emb = np.load(noisy / "photo_embeddings.npy")
    noise = rng.normal(size=emb.shape).astype(np.float32)
    np.save(noisy / "photo_embeddings.npy", noise / np.linalg.norm(noise, axis=1, keepdims=True))
    (noisy / "photos.faiss").unlink()
    import faiss

    index = faiss.IndexFlatIP(emb.shape[1])
    index.add(np.load(noisy / "photo_embeddings.npy"))
    faiss.write_index(index, str(noisy / "photos.faiss"))
    weights = {}
    for name, folder in (("real", vdir), ("noise", noisy)):
        channels = ProductChannels(folder, PRODUCTS)
        result = calibrate(channels, texts, encoder, info.language_counts, PRODUCTS)
        channels.close()
        fitted = result.report["fitted"]["logistic"]["hybrid"][OTHER]["weights"]
        weights[name] = np.abs(np.asarray(fitted))
    image = FEATURES.index("image")
    share = weights["noise"][image] / weights["noise"].sum()
    assert share < 0.2, weights  # 20 products: a little noise is fitted too
    assert weights["noise"][image] < weights["real"][image] / 4, weights


def test_photos_without_text_fields(settings: Settings, catalogue: Path, tmp_path: Path) -> None:
    """Several photos per product and no text field searched: product channels without text (the photos
    only); labels from the photos' cosine calibration, applied before the page; text modes refused."""
    build("photos", [_manifest(catalogue, tmp_path)], settings=settings)
    with IndexVersion.open(settings.index_root, "photos") as opened:
        assert opened.products is not None and opened.products.info.texts == 0
        assert opened.products.info.photos == 2 * PRODUCTS
    with LiveServer(make_settings(settings.index_root, index_name="photos")) as live, live.client() as client:
        body = client.post("/v1/search", json={"query": "a yellow umbrella", "top_k": 30}).json()
        assert body["mode"] == "image" and len(body["results"]) == PRODUCTS
        assert all(
            hit["match"] in ("strong", "weak", "none") and len(hit["images"]) == 2 for hit in body["results"]
        )
        strong = client.post("/v1/search", json={"query": "a yellow umbrella", "min_score": "strong"}).json()
        assert all(hit["match"] == "strong" for hit in strong["results"])
        assert {h["id"] for h in strong["results"]} == {
            h["id"] for h in body["results"] if h["match"] == "strong"
        }
        by_title = client.post(
            "/v1/search",
            json={
                "query": "umbrella",
                "min_score": -1.0,
                "top_k": 20,
                "sort": {"field": "category", "order": "desc"},
            },
        ).json()
        categories = [h["metadata"]["category"] for h in by_title["results"]]
        assert categories == sorted(categories, reverse=True)
        assert client.post("/v1/search", json={"query": "umbrella", "mode": "hybrid"}).status_code == 422
