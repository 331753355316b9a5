"""A rebuild of a product catalogue reuses the stored vectors of CURRENT's product channels
(``indexer.product_reuse``, ``store.product_reuse``): every photo whose file bytes are unchanged and every
text value whose (field, language, text) is unchanged keeps its stored vectors; a changed photo or value is
encoded again, and only it; a tampered stored row is encoded again and named; a parent written without the
digest files reuses nothing; ``verify`` checks the digest files. Real files, the shipped demo model."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ccrk_settings import Settings
from indexer import product_reuse as product_reuse_module
from indexer import products as products_module
from indexer.build import add, build
from store import product_reuse as store_product_reuse
from store.layout import index_dir
from store.product_reuse import (
    PHOTO_DIGESTS,
    PHOTO_ROW_DIGESTS,
    PHOTO_STATS,
    TEXT_ROW_DIGESTS,
    StoredProductVectors,
)
from store.products.channels import (
    PHOTO_EMBEDDINGS,
    PHOTO_INDEX,
    PHOTO_OWNERS,
    PHOTO_VISUAL,
    PRODUCTS_FILE,
    TEXT_EMBEDDINGS,
    TEXT_OWNERS,
)
from store.verify import verify_version
from store.version import writer as store_writer
from tests.fixtures import LiveServer, make_settings
from tests.indexer.files import write_photo

PRODUCTS = 12
TAKEN_OVER = ("products: channels taken over", "products: fusion calibration taken over")
PHOTOS = 3  # each: 36 photos, 36 text values (title, title@de, description)
VECTOR_FILES = (PHOTO_EMBEDDINGS, PHOTO_VISUAL, PHOTO_OWNERS, TEXT_EMBEDDINGS, TEXT_OWNERS)  # as present


def _shop(catalogue: Path, tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """A private copy of the catalogue's images as products of three photos and three text values."""
    shop = tmp_path / "shop"
    shutil.copytree(catalogue / "images", shop / "images")
    recs = [json.loads(line) for line in (catalogue / "test.jsonl").read_text().splitlines() if line]
    rows = []
    for i in range(PRODUCTS):
        group = recs[PHOTOS * i : PHOTOS * (i + 1)]
        rows.append(
            {
                "id": f"prod-{i}",
                "paths": [str(shop / r["image"]) for r in group],
                "title": group[0]["captions"]["en"][0],
                "title@de": group[0]["captions"]["de"][0],
                "description": group[1]["captions"]["en"][-1],
            }
        )
    return _write(shop, rows), rows


def _write(shop: Path, rows: list[dict[str, Any]]) -> Path:
    shop.mkdir(parents=True, exist_ok=True)
    path = shop / "products.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _touch(rows: list[dict[str, Any]]) -> None:
    """The same bytes with new times: the build is not CURRENT's already, every file is hashed again."""
    for row in rows:
        for p in row["paths"]:
            os.utime(p, ns=(1, 1))


def _vdir(settings: Settings, version: str | None) -> Path:
    assert version is not None
    return index_dir(settings.index_root, "shop") / version


def _arrays(settings: Settings, version: str | None) -> dict[str, np.ndarray]:
    """The channels' vector files (the demo model has no visual embeddings apart: no photo_visual.npy)."""
    folder = _vdir(settings, version)
    return {name: np.load(folder / name) for name in VECTOR_FILES if (folder / name).is_file()}


def _answers(settings: Settings, queries: list[str]) -> list[list[tuple[str, float]]]:
    """CURRENT's answers in every mode, through the service (a real uvicorn)."""
    serve = make_settings(settings.index_root, index_name="shop", text_fields=[])
    out = []
    with LiveServer(serve) as live, live.client() as client:
        for query in queries:
            for mode in ("hybrid", "text", "image"):
                body = client.post("/v1/search", json={"query": query, "mode": mode, "top_k": 8}).json()
                out.append([(h["id"], round(h["score"], 5)) for h in body["results"]])
    return out


@pytest.fixture
def product_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"text_fields": ["title", "description"]})


def test_unchanged_rebuild_encodes_no_photo_or_text_and_equals_a_forced_rebuild(
    product_settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    settings = product_settings
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    assert (first.photos_encoded, first.photos_reused) == (PRODUCTS * PHOTOS, 0)
    assert (first.texts_encoded, first.texts_reused) == (3 * PRODUCTS, 0)
    for name in (PHOTO_DIGESTS, PHOTO_ROW_DIGESTS, PHOTO_STATS, TEXT_ROW_DIGESTS):
        assert name in json.loads((_vdir(settings, first.version) / "manifest.json").read_text())["checksums"]
    _touch(rows)
    again = build("shop", [manifest], settings=settings)
    assert again.published and again.version != first.version
    assert (again.items_encoded, again.items_reused) == (0, PRODUCTS)
    assert (again.photos_encoded, again.photos_reused) == (0, PRODUCTS * PHOTOS)
    assert (again.texts_encoded, again.texts_reused) == (0, 3 * PRODUCTS)
    # The same inputs: the parent's channels taken over whole (hard links), not written and calibrated again.
    assert any(note.startswith(f"products: channels taken over from {first.version}") for note in again.notes)
    for name in (PHOTO_EMBEDDINGS, PHOTO_DIGESTS, PRODUCTS_FILE):
        assert (_vdir(settings, again.version) / name).stat().st_ino == (
            _vdir(settings, first.version) / name
        ).stat().st_ino
    queries = [rows[3]["title"], rows[7]["title@de"], "red"]
    reused_answers = _answers(settings, queries)
    forced = build("shop", [manifest], settings=settings, force=True)
    assert (forced.items_encoded, forced.photos_encoded, forced.texts_encoded) == (PRODUCTS, 36, 36)
    a, b = _arrays(settings, again.version), _arrays(settings, forced.version)
    assert a.keys() == b.keys()
    for name in a:  # bit for bit
        assert a[name].tobytes() == b[name].tobytes(), name
    for name in (PHOTO_DIGESTS, PHOTO_ROW_DIGESTS, TEXT_ROW_DIGESTS):
        assert (_vdir(settings, again.version) / name).read_bytes() == (
            _vdir(settings, forced.version) / name
        ).read_bytes()
    info = [
        json.loads((_vdir(settings, v) / PRODUCTS_FILE).read_text()) for v in (again.version, forced.version)
    ]
    assert info[0]["fusion"] == info[1]["fusion"]
    assert _answers(settings, queries) == reused_answers
    # verify checks the digest files: a tampered one is named.
    assert verify_version(settings.index_root, "shop", forced.version) == []
    path = _vdir(settings, forced.version) / PHOTO_DIGESTS
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert verify_version(settings.index_root, "shop", forced.version) == [
        f"{PHOTO_DIGESTS}: checksum mismatch"
    ]


@pytest.mark.parametrize("shards", [1, 2])
def test_channels_taken_over_keep_the_parents_checksums_so_verify_flags_a_rotted_shared_file(
    product_settings: Settings,
    catalogue: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    shards: int,
) -> None:
    """Channels linked whole share their inodes with the parent: a file that rots after the link (here, at
    once) must fail ``verify`` in the child too, so the child's manifest records the parent's checksum, not
    a fresh hash of the rotted bytes."""
    settings = product_settings.model_copy(update={"index_shards": shards})
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    real_link = products_module.link_channels

    def link_then_rot(version_dir: Path, stage: Path, known: dict[str, str]) -> list[str]:
        names = real_link(version_dir, stage, known)
        with open(stage / PHOTO_EMBEDDINGS, "r+b") as fh:  # the parent's inode: both versions rot
            fh.seek(-1, os.SEEK_END)
            byte = fh.read(1)
            fh.seek(-1, os.SEEK_END)
            fh.write(bytes([byte[0] ^ 0xFF]))
        return names

    monkeypatch.setattr(products_module, "link_channels", link_then_rot)
    _touch(rows)
    again = build("shop", [manifest], settings=settings)
    assert any(note.startswith("products: channels taken over") for note in again.notes), again.notes
    sums = [
        json.loads((_vdir(settings, v) / "manifest.json").read_text())["checksums"]
        for v in (first.version, again.version)
    ]
    assert sums[1][PHOTO_EMBEDDINGS] == sums[0][PHOTO_EMBEDDINGS]
    rotted = [f"{PHOTO_EMBEDDINGS}: checksum mismatch"]
    assert verify_version(settings.index_root, "shop", again.version) == rotted
    assert verify_version(settings.index_root, "shop", first.version) == rotted


@pytest.mark.parametrize("shards", [1, 2])
def test_channels_copied_from_a_rotted_parent_are_written_afresh(
    product_settings: Settings,
    catalogue: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    shards: int,
) -> None:
    """Channels taken over across filesystems are copies: a copy's bytes that do not match the parent's
    recorded checksum (its file rotted) are not taken over, so the child does not record the rot as good;
    the channels are written afresh and the child verifies clean (taking the copy over records the rotted
    bytes' hash: the child's file is the rotted one, and verify finds nothing)."""
    settings = product_settings.model_copy(update={"index_shards": shards})
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    path = _vdir(settings, first.version) / PHOTO_INDEX
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    rotted = [f"{PHOTO_INDEX}: checksum mismatch"]
    assert verify_version(settings.index_root, "shop", first.version) == rotted

    def copy(src: Path, dst: Path) -> bool:  # another filesystem: no hard links
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        return False

    monkeypatch.setattr(store_writer, "link_or_copy", copy)  # how every version file is taken over
    _touch(rows)
    again = build("shop", [manifest], settings=settings)
    assert again.published and (again.photos_encoded, again.texts_encoded) == (0, 0)
    assert not any(note.startswith("products: channels taken over") for note in again.notes), again.notes
    assert any(
        note.startswith(f"products: channels of {first.version} not taken over") and PHOTO_INDEX in note
        for note in again.notes
    ), again.notes
    assert (_vdir(settings, again.version) / PHOTO_INDEX).read_bytes() != bytes(data)
    assert verify_version(settings.index_root, "shop", again.version) == []


def test_another_acquirer_or_calibration_code_encodes_texts_or_calibrates_again(
    product_settings: Settings, catalogue: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the reuse key (the model's fingerprint) does not cover: a language acquirer added or retrained
    (text values of its language are embedded by it) encodes every text value again and calibrates again;
    calibration code of another version calibrates again. Photos are reused either way."""
    settings = product_settings
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    assert json.loads((_vdir(settings, first.version) / PRODUCTS_FILE).read_text())["calibration_code"] >= 1
    monkeypatch.setattr(products_module, "acquirers_digest", lambda model_dir: "another acquirer")
    _touch(rows)
    second = build("shop", [manifest], settings=settings)
    assert (second.photos_encoded, second.photos_reused) == (0, PRODUCTS * PHOTOS)
    assert (second.texts_encoded, second.texts_reused) == (3 * PRODUCTS, 0)
    assert not any(note.startswith(TAKEN_OVER) for note in second.notes), second.notes
    info = json.loads((_vdir(settings, second.version) / PRODUCTS_FILE).read_text())
    assert info["text_encoder"] == "another acquirer"
    # The same acquirer, but calibration code of another version: not linked, calibrated again.
    monkeypatch.setattr(product_reuse_module, "CALIBRATION_CODE", 99)
    monkeypatch.setattr(products_module, "CALIBRATION_CODE", 99)
    for row in rows:  # other times again: not the last build's key
        for p in row["paths"]:
            os.utime(p, ns=(2, 2))
    third = build("shop", [manifest], settings=settings)
    assert (third.texts_encoded, third.texts_reused) == (0, 3 * PRODUCTS)
    assert not any(note.startswith(TAKEN_OVER) for note in third.notes), third.notes
    assert json.loads((_vdir(settings, third.version) / PRODUCTS_FILE).read_text())["calibration_code"] == 99


def test_a_changed_photo_and_text_value_are_the_only_ones_encoded(
    product_settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    settings = product_settings
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    write_photo(Path(rows[2]["paths"][1]), 901, (64, 64))  # product 2's second photo: new bytes
    write_photo(Path(rows[5]["paths"][0]), 902, (64, 64))  # product 5's first photo (its main row)
    rows[8]["title"] = "a brand new title for product eight"
    changed = build("shop", [_write(manifest.parent, rows)], settings=settings)
    assert (changed.items_encoded, changed.items_reused) == (1, PRODUCTS - 1)
    assert (changed.photos_encoded, changed.photos_reused) == (2, PRODUCTS * PHOTOS - 2)
    assert (changed.texts_encoded, changed.texts_reused) == (1, 3 * PRODUCTS - 1)
    assert not any("channels taken over" in note for note in changed.notes)
    # 3 of 72 rows changed: the fusion calibration is the parent's (within 5 %), the walks tuned again.
    infos = {
        v: json.loads((_vdir(settings, v) / PRODUCTS_FILE).read_text())
        for v in (first.version, changed.version)
    }
    assert (infos[changed.version]["calibrated_in"], infos[changed.version]["changed_since_calibration"]) == (
        first.version,
        3,
    )
    assert infos[changed.version]["fusion"] == infos[first.version]["fusion"]
    assert any(f"fusion calibration taken over from {first.version}" in note for note in changed.notes)
    forced = build("shop", [manifest], settings=settings, force=True)
    a, b = _arrays(settings, changed.version), _arrays(settings, forced.version)
    np.testing.assert_array_equal(a[PHOTO_OWNERS], b[PHOTO_OWNERS])
    for name in (PHOTO_EMBEDDINGS, TEXT_EMBEDDINGS):
        np.testing.assert_allclose(a[name], b[name], atol=1e-5)
    old = _arrays(settings, first.version)
    moved = np.flatnonzero(~np.isclose(old[PHOTO_EMBEDDINGS], a[PHOTO_EMBEDDINGS], atol=1e-6).all(axis=1))
    assert moved.tolist() == [PHOTOS * 2 + 1, PHOTOS * 5]
    assert verify_version(settings.index_root, "shop", changed.version) == []
    forced_info = json.loads((_vdir(settings, forced.version) / PRODUCTS_FILE).read_text())
    assert (forced_info["calibrated_in"], forced_info["changed_since_calibration"]) == ("", 0)
    # Two values changed since the forced build calibrated: 2 of 72, taken over; two more after that:
    # 2 + 2 = 4 of 72 (5.6 %) passes 5 %, calibrated again.
    rows[9]["title"], rows[10]["title"] = "a new title for nine", "a new title for ten"
    more = build("shop", [_write(manifest.parent, rows)], settings=settings)
    assert (
        json.loads((_vdir(settings, more.version) / PRODUCTS_FILE).read_text())["calibrated_in"]
        == forced.version
    )
    rows[11]["title"], rows[0]["description"] = "a new title for eleven", "a new description for zero"
    again = build("shop", [_write(manifest.parent, rows)], settings=settings)
    again_info = json.loads((_vdir(settings, again.version) / PRODUCTS_FILE).read_text())
    assert (again_info["calibrated_in"], again_info["changed_since_calibration"]) == ("", 0)
    assert not any("fusion calibration taken over" in note for note in again.notes)


def test_photos_and_values_copied_from_other_products_count_as_changed_for_the_calibration(
    product_settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    """A photo or text value replaced by a copy of another product's reuses that product's stored row: no
    encoding, but the catalogue changed all the same. Two photos and two titles so copied are 4 of 72 rows
    (5.6 %): past 5 %, calibrated again (counting reuse occurrences instead of distinct parent rows carried
    over sees none changed, photos or texts alike)."""
    settings = product_settings
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    for i in (1, 2):  # a second photo: the bytes of product 0's first, a title: product 0's
        shutil.copyfile(rows[0]["paths"][0], rows[i]["paths"][1])
        rows[i + 2]["title"] = rows[0]["title"]
    copied = build("shop", [_write(manifest.parent, rows)], settings=settings)
    assert (copied.photos_encoded, copied.photos_reused) == (0, PRODUCTS * PHOTOS)
    assert (copied.texts_encoded, copied.texts_reused) == (0, 3 * PRODUCTS)
    info = json.loads((_vdir(settings, copied.version) / PRODUCTS_FILE).read_text())
    assert (info["calibrated_in"], info["changed_since_calibration"]) == ("", 0), copied.notes
    assert not any(note.startswith(TAKEN_OVER) for note in copied.notes), copied.notes
    assert first.version != copied.version


def test_equal_photos_and_values_of_one_product_carry_over_a_row_each(
    product_settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    """A product with two photo files of the very same bytes, and a title given untagged and tagged with
    the language it is identified in: a rebuild with no row changed (a photo file moved: not taken over
    whole) counts none changed, so the calibration's count does not grow with every rebuild (each equal
    photo or value mapped to the product's first row carries one row over for two: 2 changed)."""
    settings = product_settings
    manifest, rows = _shop(catalogue, tmp_path)
    shutil.copyfile(rows[0]["paths"][0], rows[0]["paths"][1])
    rows[1]["title@en"] = rows[1]["title"]
    first = build("shop", [_write(manifest.parent, rows)], settings=settings)
    assert first.texts_encoded == 3 * PRODUCTS + 1
    moved = Path(rows[5]["paths"][2]).with_name("moved.jpg")
    Path(rows[5]["paths"][2]).rename(moved)
    rows[5]["paths"][2] = str(moved)
    again = build("shop", [_write(manifest.parent, rows)], settings=settings)
    assert (again.photos_encoded, again.photos_reused) == (0, PRODUCTS * PHOTOS)
    assert (again.texts_encoded, again.texts_reused) == (0, 3 * PRODUCTS + 1)
    assert not any("channels taken over" in note for note in again.notes), again.notes
    info = json.loads((_vdir(settings, again.version) / PRODUCTS_FILE).read_text())
    assert (info["calibrated_in"], info["changed_since_calibration"]) == (first.version, 0)


def test_a_resumed_build_encodes_a_photo_replaced_since_the_failed_run(
    product_settings: Settings, catalogue: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build that failed after encoding the further photos leaves their work folder for the next run; a
    photo whose file was replaced meanwhile (same path) is encoded again, not taken from that folder."""
    settings = product_settings
    manifest, rows = _shop(catalogue, tmp_path)

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("killed after the photos")

    with monkeypatch.context() as patch:
        patch.setattr(products_module, "text_rows", fail)
        with pytest.raises(RuntimeError, match="killed after the photos"):
            build("shop", [manifest], settings=settings)
    assert list(index_dir(settings.index_root, "shop").glob(".builds/*/photos-*"))  # left to resume from
    write_photo(Path(rows[3]["paths"][2]), 903, (64, 64))  # product 3's third photo: row 11
    resumed = build("shop", [manifest], settings=settings)
    forced = build("shop", [manifest], settings=settings, force=True)
    a, b = _arrays(settings, resumed.version), _arrays(settings, forced.version)
    np.testing.assert_allclose(
        a[PHOTO_EMBEDDINGS][PHOTOS * 3 + 2], b[PHOTO_EMBEDDINGS][PHOTOS * 3 + 2], atol=1e-5
    )


def test_tampered_stored_rows_are_encoded_again_and_named(
    product_settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    settings = product_settings
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    vdir = _vdir(settings, first.version)
    good = _arrays(settings, first.version)
    for name, row in ((PHOTO_EMBEDDINGS, 4), (TEXT_EMBEDDINGS, 7)):  # row 4: product 1's second photo
        path, arr = vdir / name, good[name]
        header = path.stat().st_size - arr.nbytes
        with open(path, "r+b") as fh:
            fh.seek(header + row * arr.shape[1] * 4)
            fh.write(np.full(arr.shape[1], 0.5, np.float32).tobytes())
    _touch(rows)
    again = build("shop", [manifest], settings=settings)
    assert (again.photos_encoded, again.photos_reused) == (1, PRODUCTS * PHOTOS - 1)
    assert (again.texts_encoded, again.texts_reused) == (1, 3 * PRODUCTS - 1)
    assert again.reuse_mismatched == [f"photo {rows[1]['paths'][1]}", "text title of prod-2"]
    assert any("failed their checksum" in note and "product vector" in note for note in again.notes)
    fixed = _arrays(settings, again.version)
    for name in (PHOTO_EMBEDDINGS, TEXT_EMBEDDINGS):
        np.testing.assert_allclose(fixed[name], good[name], atol=1e-5)
    assert verify_version(settings.index_root, "shop", again.version) == []


def test_stored_rows_are_checked_in_bounded_chunks(
    product_settings: Settings, catalogue: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reused rows' check reads and hashes at most ``CHECK_CHUNK`` rows at a time (a million photos'
    vectors at once are gigabytes), and still finds a tampered row past the first chunk."""
    settings = product_settings
    manifest, _ = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    vdir = _vdir(settings, first.version)
    good = _arrays(settings, first.version)
    for name, row in ((PHOTO_EMBEDDINGS, 29), (TEXT_EMBEDDINGS, 17)):
        path, arr = vdir / name, good[name]
        with open(path, "r+b") as fh:
            fh.seek(path.stat().st_size - arr.nbytes + row * arr.shape[1] * 4)
            fh.write(np.full(arr.shape[1], 0.5, np.float32).tobytes())
    monkeypatch.setattr(store_product_reuse, "CHECK_CHUNK", 4, raising=False)
    read: list[int] = []
    stored = StoredProductVectors(vdir)
    real_photos, real_texts = stored.photo_vectors, stored.text_vectors

    def photo_vectors(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        read.append(len(rows))
        return real_photos(rows)

    def text_vectors(rows: np.ndarray) -> np.ndarray:
        read.append(len(rows))
        return real_texts(rows)

    monkeypatch.setattr(stored, "photo_vectors", photo_vectors)
    monkeypatch.setattr(stored, "text_vectors", text_vectors)
    photos, texts = np.arange(PRODUCTS * PHOTOS)[::-1], np.arange(3 * PRODUCTS)
    assert np.flatnonzero(~stored.check_photos(photos)).tolist() == [PRODUCTS * PHOTOS - 1 - 29]
    assert np.flatnonzero(~stored.check_texts(texts)).tolist() == [17]
    assert max(read) == 4 and sum(read) == PRODUCTS * PHOTOS + 3 * PRODUCTS
    stored.close()


def test_a_parent_without_digest_files_reuses_nothing(
    product_settings: Settings, catalogue: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = product_settings
    manifest, rows = _shop(catalogue, tmp_path)
    with monkeypatch.context() as patch:  # a version as written before the digest files
        patch.setattr(products_module, "write_product_digests", lambda *a, **k: None)
        first = build("shop", [manifest], settings=settings)
    assert not (_vdir(settings, first.version) / PHOTO_DIGESTS).exists()
    _touch(rows)
    again = build("shop", [manifest], settings=settings)
    assert (again.items_encoded, again.items_reused) == (0, PRODUCTS)  # the main rows have their digests
    assert (again.photos_encoded, again.photos_reused) == (PRODUCTS * PHOTOS, 0)
    assert (again.texts_encoded, again.texts_reused) == (3 * PRODUCTS, 0)
    assert any("holds no reusable product vectors" in note for note in again.notes)
    a, b = _arrays(settings, again.version), _arrays(settings, first.version)
    np.testing.assert_array_equal(a[PHOTO_OWNERS], b[PHOTO_OWNERS])
    for name in (PHOTO_EMBEDDINGS, TEXT_EMBEDDINGS):
        np.testing.assert_allclose(a[name], b[name], atol=1e-5)
    assert (_vdir(settings, again.version) / PHOTO_DIGESTS).is_file()  # the next build reuses them
    assert verify_version(settings.index_root, "shop", again.version) == []


def test_sharded_versions_write_the_digests_beside_the_shards_and_reuse_them(
    product_settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    settings = product_settings.model_copy(update={"index_shards": 2})
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    vdir = _vdir(settings, first.version)
    assert PHOTO_DIGESTS in json.loads((vdir / "manifest.json").read_text())["checksums"]
    _touch(rows)
    again = build("shop", [manifest], settings=settings)
    assert again.items_encoded == PRODUCTS  # sharded main rows are not reused yet; their photos are
    assert (again.photos_encoded, again.photos_reused) == (0, PRODUCTS * PHOTOS)
    assert (again.texts_encoded, again.texts_reused) == (0, 3 * PRODUCTS)
    a, b = _arrays(settings, again.version), _arrays(settings, first.version)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name
    assert verify_version(settings.index_root, "shop", again.version) == []
    path = _vdir(settings, again.version) / TEXT_ROW_DIGESTS
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert verify_version(settings.index_root, "shop", again.version) == [
        f"{TEXT_ROW_DIGESTS}: checksum mismatch"
    ]


def test_photos_added_by_add_are_reused_by_the_next_build(
    product_settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    settings = product_settings
    manifest, rows = _shop(catalogue, tmp_path)
    part = _write(manifest.parent / "part", rows[:8])
    build("shop", [part], settings=settings)
    added = add("shop", [manifest], settings=settings)  # the parent's photo digests, then the added ones'
    assert added.published and (_vdir(settings, added.version) / PHOTO_DIGESTS).is_file()
    assert verify_version(settings.index_root, "shop", added.version) == []
    _touch(rows)
    again = build("shop", [manifest], settings=settings)
    assert (again.items_encoded, again.photos_encoded, again.texts_encoded) == (0, 0, 0)
    assert (again.photos_reused, again.texts_reused) == (PRODUCTS * PHOTOS, 3 * PRODUCTS)
    a, b = _arrays(settings, again.version), _arrays(settings, added.version)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name


def _break_fusion(folder: Path) -> dict[str, Any]:
    """The version's stored fusion made unparseable as a builder's bug would write it (its checksum
    recorded); returns the good one."""
    from store.layout import MANIFEST_FILE, sha256_file
    from store.version.manifest import IndexManifest

    info = json.loads((folder / PRODUCTS_FILE).read_text(encoding="utf-8"))
    good = info["fusion"]
    info["fusion"] = {**good, "hybrid": ["not", "a", "table"]}
    (folder / PRODUCTS_FILE).write_text(json.dumps(info), encoding="utf-8")
    recorded = IndexManifest.load(folder / MANIFEST_FILE)
    recorded.checksums[PRODUCTS_FILE] = sha256_file(folder / PRODUCTS_FILE)
    recorded.save(folder / MANIFEST_FILE)
    return good


def test_a_parent_fusion_that_cannot_be_parsed_is_not_carried_forward(
    product_settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    """A parent whose stored fusion cannot be parsed (served by reciprocal rank) is neither linked whole by
    a rebuild of the same photos and values nor has its calibration taken over after a small change: the
    rebuild calibrates again, and its version verifies."""
    settings = product_settings
    manifest, rows = _shop(catalogue, tmp_path)
    first = build("shop", [manifest], settings=settings)
    good = _break_fusion(_vdir(settings, first.version))
    assert verify_version(settings.index_root, "shop", first.version) != []
    _touch(rows)  # the same photos and values (else nothing is built at all: "already published")
    again = build("shop", [manifest], settings=settings)
    assert not any(note.startswith(TAKEN_OVER) for note in again.notes), again.notes
    fresh = json.loads((_vdir(settings, again.version) / PRODUCTS_FILE).read_text(encoding="utf-8"))
    assert fresh["fusion"] == good and fresh["calibrated_in"] == "", again.notes
    assert verify_version(settings.index_root, "shop", again.version) == []
    _break_fusion(_vdir(settings, again.version))
    rows[8]["title"] = "a brand new title for product eight"  # 1 of 72 rows: within the 5 % taken over
    changed = build("shop", [_write(manifest.parent, rows)], settings=settings)
    assert not any(note.startswith(TAKEN_OVER) for note in changed.notes), changed.notes
    info = json.loads((_vdir(settings, changed.version) / PRODUCTS_FILE).read_text(encoding="utf-8"))
    assert info["calibrated_in"] == "" and isinstance(info["fusion"]["hybrid"], dict)
    assert verify_version(settings.index_root, "shop", changed.version) == []
