"""``ccrk index compact`` over upserts (``indexer.live_compact``), on real product builds with the demo model
and a real SQLite change log: the upserted products are folded by a build of the catalogue CURRENT and the
log describe (CURRENT's vectors reused, the upserted ones encoded: a new product's vector is exactly that of
a built product with the same photo), the log is emptied, and the version records the last sequence; what
a build cannot hold (a product without a photo, CURRENT's photos gone from their paths) stays in the log,
said in the report; a compaction whose CURRENT changed under it publishes nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ccrk_settings import Settings
from indexer.build import build, build_catalogue
from indexer.errors import BuildError
from indexer.live_compact import compact, read_catalogue
from indexer.sources import SourceScan
from store.live import Delete, Patch, SqliteChangeLog, Upsert
from store.live.photos import PhotoStore
from store.opening import open_version
from store.version.versions import current_version

N = 12


@pytest.fixture
def shop(settings: Settings, catalogue: Path, tmp_path: Path) -> tuple[Settings, list[Path]]:
    """Index ``shop`` of N products (a photo copied into tmp_path, a title, a price), searched by title;
    its photos."""
    recs = [json.loads(line) for line in (catalogue / "test.jsonl").read_text().splitlines()]
    photos = tmp_path / "photos"
    photos.mkdir()
    paths = []
    for i, rec in enumerate(recs[: N + 2]):
        paths.append(photos / f"p{i}.png")
        shutil.copyfile(catalogue / rec["image"], paths[-1])
    rows = [
        {"id": f"sku-{i}", "path": str(paths[i]), "title": recs[i]["captions"]["en"][0], "price": 10.0 + i}
        for i in range(N)
    ]
    manifest = tmp_path / "products.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = settings.model_copy(update={"text_fields": ["title"]})
    assert build("shop", [manifest], settings=settings).published
    return settings, paths


def item(root: Path, item_id: str) -> dict[str, Any] | None:
    with open_version(root, "shop") as opened:
        row = opened.row_of(item_id)
        return None if row is None else opened.items([row])[0]


def embedding(root: Path, item_id: str) -> np.ndarray:
    with open_version(root, "shop") as opened:
        row = opened.row_of(item_id)
        assert row is not None
        return opened.embeddings(np.array([row]))[0]


def new_product(root: Path, photo: Path) -> Upsert:
    """A new product "new-1" titled "x" with ``photo``, stored as a write through the API stores it."""
    return Upsert(
        "new-1", text={"title": "x"}, photos=(PhotoStore(root, "shop").put(photo.read_bytes(), "PNG"),)
    )


def test_compact_folds_upserts_by_a_build_and_empties_the_log(shop: tuple[Settings, list[Path]]) -> None:
    settings, paths = shop
    root = settings.index_root
    stored = PhotoStore(root, "shop")
    new_photo = stored.put(paths[N].read_bytes(), "PNG")
    same_as_3 = stored.put(paths[3].read_bytes(), "PNG")
    changes = [
        Patch("sku-0", fields={"price": 0.25}),
        Upsert(
            "new-1",
            fields={"price": 5.5, "in_stock": True},
            text={"title": "a new thing"},
            photos=(new_photo,),
        ),
        Patch("new-1", fields={"price": 4.5}),
        Delete("sku-1"),
        Upsert(
            "sku-2", fields={"price": 2.0}, text={"title": "the same photo as sku-3"}, photos=(same_as_3,)
        ),
        Upsert("gone-1", text={"title": "upserted, then deleted"}, photos=(new_photo,)),
        Delete("gone-1"),
    ]
    with SqliteChangeLog.for_index(root, "shop") as log:
        last = log.append(changes)[-1]
    before = current_version(root, "shop")
    report = compact("shop", settings=Settings(index_root=root, model_dir=settings.model_dir))
    assert report.published and report.operation == "compact", report.notes
    # Vectors are reused by photo bytes: CURRENT's products and sku-2 (now sku-3's photo); new-1 is encoded.
    assert (report.items_reused, report.items_encoded) == (N - 1, 1), report.notes
    with SqliteChangeLog.for_index(root, "shop") as log:
        assert log.pending() == 0 and log.folded_sequence() == last
    with open_version(root, "shop") as opened:
        assert opened.manifest.live_sequence == last and opened.manifest.parent_version == before
        assert len(opened) == N  # N - sku-1 + new-1
        assert sorted(opened.products.info.fields) == ["title"]  # CURRENT's searched text fields kept
    assert item(root, "sku-0")["price"] == 0.25  # type: ignore[index]
    assert item(root, "sku-1") is None and item(root, "gone-1") is None
    new = item(root, "new-1")
    assert new is not None and (new["price"], new["title"], new["in_stock"]) == (4.5, "a new thing", True)
    assert Path(new["path"]) == stored.path_of(new_photo)
    replaced = item(root, "sku-2")
    assert replaced is not None and (replaced["price"], replaced["title"]) == (2.0, "the same photo as sku-3")
    # A photo's vector is the photo's, whoever holds it: sku-2 now shows sku-3's photo.
    np.testing.assert_array_equal(embedding(root, "sku-2"), embedding(root, "sku-3"))
    # Nothing pending: a second compaction publishes nothing.
    again = compact("shop", settings=Settings(index_root=root, model_dir=settings.model_dir))
    assert not again.published and current_version(root, "shop") == report.version


def test_what_a_build_cannot_hold_stays_in_the_log(shop: tuple[Settings, list[Path]]) -> None:
    settings, _ = shop
    root = settings.index_root
    with SqliteChangeLog.for_index(root, "shop") as log:
        first = log.append([Patch("sku-0", fields={"price": 1.5})])[-1]
        log.append(
            [Upsert("text-only", text={"title": "no photo at all"}), Patch("sku-4", fields={"price": 3.0})]
        )
    report = compact("shop", settings=settings)
    assert report.published
    assert any("which a build cannot hold (it has no photo)" in note for note in report.notes), report.notes
    with SqliteChangeLog.for_index(root, "shop") as log:
        assert log.pending() == 2  # the text-only product and the patch after it, served from the log
    with open_version(root, "shop") as opened:
        assert opened.manifest.live_sequence == first
    assert item(root, "sku-0")["price"] == 1.5 and item(root, "sku-4")["price"] == 14.0  # type: ignore[index]


def test_current_photos_gone_leave_the_upserts_to_a_build_from_a_manifest(
    shop: tuple[Settings, list[Path]],
) -> None:
    settings, paths = shop
    root = settings.index_root
    paths[5].unlink()  # the build would drop sku-5
    upsert = new_product(root, paths[N])
    with SqliteChangeLog.for_index(root, "shop") as log:
        log.append([Patch("sku-0", fields={"price": 1.5}), upsert])
    report = compact("shop", settings=settings)
    assert report.published and item(root, "sku-0")["price"] == 1.5  # type: ignore[index]
    assert any("the photo of 'sku-5' is not at" in note for note in report.notes), report.notes
    assert item(root, "sku-5") is not None and item(root, "new-1") is None
    with SqliteChangeLog.for_index(root, "shop") as log:
        assert log.pending() == 1


def test_a_compaction_whose_current_changed_publishes_nothing(shop: tuple[Settings, list[Path]]) -> None:
    settings, paths = shop
    root = settings.index_root
    upsert = new_product(root, paths[N])
    with SqliteChangeLog.for_index(root, "shop") as log:
        last = log.append([upsert])[-1]
        read = read_catalogue(root, "shop", log, last)
    assert not isinstance(read, str) and read.upserts == 1
    held = current_version(root, "shop")
    with pytest.raises(BuildError, match="nothing was published"):
        build_catalogue(
            "shop", SourceScan(read.items), settings=settings, live_sequence=last, expect_current="elsewhere"
        )
    assert current_version(root, "shop") == held


def test_a_change_that_nets_to_nothing_is_still_folded(shop: tuple[Settings, list[Path]]) -> None:
    settings, paths = shop
    root = settings.index_root
    upsert = new_product(root, paths[N])
    with SqliteChangeLog.for_index(root, "shop") as log:
        last = log.append([upsert, Delete("new-1")])[-1]
    report = compact("shop", settings=settings)
    assert report.published, report.notes  # the same products as CURRENT, but the version holds the log
    with SqliteChangeLog.for_index(root, "shop") as log:
        assert log.pending() == 0
    with open_version(root, "shop") as opened:
        assert opened.manifest.live_sequence == last and len(opened) == N


def test_the_searched_text_fields_keep_their_order(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    recs = [json.loads(line) for line in (catalogue / "test.jsonl").read_text().splitlines()]
    rows = [
        {"id": f"sku-{i}", "path": str(catalogue / recs[i]["image"]), "title": recs[i]["captions"]["en"][0],
         "subtitle": recs[i]["captions"]["de"][0]}
        for i in range(N)
    ]  # fmt: skip
    manifest = tmp_path / "two-fields.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    two = settings.model_copy(update={"text_fields": ["title", "subtitle"]})  # not in sorted order
    assert build("shop", [manifest], settings=two).published
    with open_version(two.index_root, "shop") as opened:
        before = list(opened.products.info.fields)
    photo = PhotoStore(two.index_root, "shop").put((catalogue / recs[N]["image"]).read_bytes(), "PNG")
    with SqliteChangeLog.for_index(two.index_root, "shop") as log:
        log.append([Upsert("new-1", text={"title": "x", "subtitle": "y"}, photos=(photo,))])
    report = compact("shop", settings=Settings(index_root=two.index_root, model_dir=two.model_dir))
    assert report.published, report.notes
    with open_version(two.index_root, "shop") as opened:
        assert list(opened.products.info.fields) == before == ["title", "subtitle"]
