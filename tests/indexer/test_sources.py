"""Reading sources: folders (recursive), JSONL and CSV manifests with metadata, the synthetic catalogue."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from indexer.errors import SourceError
from indexer.sources import (
    LINK_LOOP,
    LINK_OUT_OF_FOLDER,
    LINK_OUTSIDE,
    LINK_TO_INSIDE_FOLDER,
    read_sources,
)
from tests.indexer.files import write_photo
from tests.indexer.manifest_fuzz import MANIFESTS, check_manifest


def test_folder_is_recursive_sorted_and_ignores_non_images(photo_folder: Path) -> None:
    scan = read_sources([photo_folder])
    ids = [it.id for it in scan.items]
    assert ids == [
        *(f"p{i}.jpg" for i in range(4)),
        "sub/a.png",
        "sub/anim.gif",
        "sub/b.webp",
        *(f"sub/deeper/q{i}.jpeg" for i in range(5)),
    ]
    assert scan.ignored == 1  # notes.txt
    item = next(it for it in scan.items if it.id == "sub/a.png")
    assert item.path == photo_folder / "sub" / "a.png" and item.fields == {}


def test_csv_manifest_metadata_types_and_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    manifest = tmp_path / "m" / "shop.csv"
    manifest.write_text(
        "id,path,title,category,price,brand,stock\n"
        "sku-1,img/1.jpg,Red shoe,shoes,19.99,acme,3\n"
        "sku-2,/abs/2.jpg,Bag,bags,5,00123,\n"
    )
    items = read_sources([manifest]).items
    assert [it.id for it in items] == ["sku-1", "sku-2"]
    assert items[0].path == tmp_path / "m" / "img" / "1.jpg"
    assert items[1].path == Path("/abs/2.jpg")
    assert items[0].fields == {
        "title": "Red shoe",
        "category": "shoes",
        "price": 19.99,
        "brand": "acme",
        "stock": 3,
    }
    # Leading-zero codes stay text; empty cells are absent rather than "".
    assert items[1].fields == {"title": "Bag", "category": "bags", "price": 5, "brand": "00123"}


def test_jsonl_manifest_and_catalogue(tmp_path: Path, catalogue: Path) -> None:
    manifest = tmp_path / "shop.jsonl"
    manifest.write_text(
        json.dumps({"id": "a", "path": "x/a.png", "price": 3.5, "tags": ["new"]})
        + "\n\n"
        + json.dumps({"id": 7, "path": "b.png"})
        + "\n"
    )
    items = read_sources([manifest, catalogue / "test.jsonl"]).items
    assert items[0].fields == {"price": 3.5, "tags": ["new"]} and items[0].path == tmp_path / "x" / "a.png"
    assert items[1].id == "7"
    cat = items[2]
    assert cat.id == "test-000000" and cat.path.is_file()
    assert set(cat.captions) >= {"en", "de", "ja", "zh"} and "category" in cat.fields


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        ('{"id": "a", "path": "a.png"}\n{"id": "b", "path": \n', ".jsonl", r"shop.jsonl:2: invalid JSON"),
        ('{"id": "", "path": "a.png"}\n', ".jsonl", r"shop.jsonl:1: field 'id'"),
        ('{"id": "a"}\n', ".jsonl", r"shop.jsonl:1: field 'path'"),
        ("id,title\na,b\n", ".csv", r"shop.csv: CSV header lacks column\(s\) path"),
        (
            '{"id": "a", "path": "1.png"}\n{"id": "a", "path": "2.png"}\n',
            ".jsonl",
            r"duplicate id 'a'.*shop.jsonl:1",
        ),
    ],
)
def test_malformed_manifests_name_file_and_line(tmp_path: Path, text: str, suffix: str, message: str) -> None:
    path = tmp_path / f"shop{suffix}"
    path.write_text(text)
    with pytest.raises(SourceError, match=message):
        read_sources([path])


def test_missing_or_unknown_source(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="source not found"):
        read_sources([tmp_path / "nope"])
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(SourceError, match=r"not a folder, \.jsonl or \.csv"):
        read_sources([tmp_path / "x.txt"])


def test_links_out_of_the_folder_are_skipped_and_reported(tmp_path: Path) -> None:
    """Links are judged by where they resolve to: inside the source folder they are indexed (under the
    link's path), out of it they are skipped and listed unless follow_external_links; folder links inside
    are never followed (their images are indexed under their own paths), and no folder is walked twice."""
    root = tmp_path / "photos"
    write_photo(root / "a.jpg", 1)
    write_photo(root / "sub" / "b.jpg", 2)
    outside = tmp_path / "private"
    write_photo(outside / "secret.jpg", 3)
    write_photo(outside / "album" / "c.jpg", 4)
    (root / "inside.jpg").symlink_to(root / "sub" / "b.jpg")
    (root / "relative.jpg").symlink_to("sub/b.jpg")
    (root / "out.jpg").symlink_to(outside / "secret.jpg")
    (root / "sneaky.jpg").symlink_to("sub/../../private/secret.jpg")
    (root / "hop.jpg").symlink_to(root / "out.jpg")  # a link inside to a link that leads out
    (root / "album").symlink_to(outside / "album", target_is_directory=True)
    (root / "again").symlink_to(root / "sub", target_is_directory=True)
    (outside / "album" / "loop").symlink_to(outside / "album", target_is_directory=True)
    (outside / "album" / "home").symlink_to(root, target_is_directory=True)
    secret = os.path.realpath(outside / "secret.jpg")

    scan = read_sources([root])
    assert [it.id for it in scan.items] == ["a.jpg", "inside.jpg", "relative.jpg", "sub/b.jpg"]
    assert next(it for it in scan.items if it.id == "inside.jpg").path == root / "inside.jpg"
    links = {Path(s["path"]).name: (s["target"], s["reason"]) for s in scan.skipped_links}
    assert links == {
        "album": (os.path.realpath(outside / "album"), LINK_OUTSIDE),
        "again": (os.path.realpath(root / "sub"), LINK_TO_INSIDE_FOLDER),
        "hop.jpg": (secret, LINK_OUTSIDE),
        "out.jpg": (secret, LINK_OUTSIDE),
        "sneaky.jpg": (secret, LINK_OUTSIDE),
    }
    assert "CCRK_FOLLOW_EXTERNAL_LINKS" in LINK_OUTSIDE  # the message says how to index them

    scan = read_sources([root], follow_external_links=True)
    assert [it.id for it in scan.items] == [
        "a.jpg",
        "hop.jpg",
        "inside.jpg",
        "out.jpg",
        "relative.jpg",
        "sneaky.jpg",
        "album/c.jpg",
        "sub/b.jpg",
    ]
    assert next(it for it in scan.items if it.id == "album/c.jpg").path == root / "album" / "c.jpg"
    links = {s["path"]: s["reason"] for s in scan.skipped_links}
    assert links == {
        str(root / "album" / "home"): LINK_TO_INSIDE_FOLDER,
        str(root / "album" / "loop"): LINK_LOOP,
        str(root / "again"): LINK_TO_INSIDE_FOLDER,
    }


def test_manifest_paths_are_the_paths_pathlib_makes(tmp_path: Path) -> None:
    # Paths are built as children of their folder's Path (no parse per row): they must equal Path(text)
    # in every way a caller sees, whatever the manifest writes.
    from indexer.sources import _absolute

    folders: dict[str, Path] = {}
    base = str(tmp_path)
    for value in ["a.jpg", "img/b.jpg", "./img/../c.jpg", "img//d.jpg", "/abs/x/./e.jpg", "/abs/x/", "/abs/.",
                  "/abs/../f.jpg", "img/", "/g.jpg", "~/h.jpg"]:  # fmt: skip
        got = _absolute(base, value, folders)
        text = os.path.expanduser(value)
        ref = Path(text if os.path.isabs(text) else os.path.normpath(os.path.join(base, text)))
        assert (got, str(got), got.parts, got.name, got.parent, hash(got)) == (
            ref, str(ref), ref.parts, ref.name, ref.parent, hash(ref)
        ), value  # fmt: skip


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(MANIFESTS)
def test_fuzzed_manifests_are_read_or_refused_never_a_traceback(manifest: tuple[str, bytes]) -> None:
    """bench/manifest_fuzz.py runs the same check over 10,000 cases."""
    assert check_manifest(*manifest) in ("accepted", "refused")


def test_a_manifests_photos_that_link_out_of_their_folder_are_skipped(tmp_path: Path) -> None:
    """As a folder's scan skips them (and the service refuses to serve them): a product's link out of its
    folder is not one of its photos, and is listed; a link to a neighbour in the folder is kept."""
    secret = write_photo(tmp_path / "private" / "secret.jpg", 9)
    photos = tmp_path / "shop" / "photos"
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        write_photo(photos / name, len(name))
    (photos / "out.jpg").symlink_to(secret)
    (photos / "sneaky.jpg").symlink_to("../../private/secret.jpg")
    (photos / "neighbour.jpg").symlink_to("c.jpg")
    manifest = tmp_path / "shop" / "products.jsonl"
    rows = [
        {"id": "p1", "paths": ["photos/a.jpg", "photos/out.jpg", "photos/neighbour.jpg"]},
        {"id": "p2", "paths": ["photos/sneaky.jpg", "photos/b.jpg"]},  # its first photo: b.jpg now
        {"id": "p3", "paths": ["photos/out.jpg"]},  # no photo left: not indexed
        {"id": "p4", "path": "photos/sneaky.jpg"},
    ]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    scan = read_sources([manifest])
    got = {it.id: [it.path.name, *(p.name for p in it.extra_paths)] for it in scan.items}
    assert got == {"p1": ["a.jpg", "neighbour.jpg"], "p2": ["b.jpg"]}
    assert [(Path(s["path"]).name, s["reason"]) for s in scan.skipped_links] == [
        ("out.jpg", LINK_OUT_OF_FOLDER),
        ("sneaky.jpg", LINK_OUT_OF_FOLDER),
        ("out.jpg", LINK_OUT_OF_FOLDER),
        ("sneaky.jpg", LINK_OUT_OF_FOLDER),
    ]
    assert all(s["target"] == str(secret.resolve()) for s in scan.skipped_links)
    followed = read_sources([manifest], follow_external_links=True)
    assert [it.id for it in followed.items] == ["p1", "p2", "p3", "p4"] and followed.skipped_links == []
    assert [p.name for p in followed.items[0].extra_paths] == ["out.jpg", "neighbour.jpg"]
