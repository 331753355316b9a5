"""Catalogue images as served: a file or a parent folder swapped for a link after indexing is refused (403),
never its target; a link staying in its folder is served; thumbnails of 16-bit greyscale scans keep their
grey (a real uvicorn, real files)."""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from tests.fixtures import Catalogue, LiveServer, make_settings, write_version

SECRET = b"root:x:0:0:root:/root:/bin/bash\n"


def test_a_file_swapped_for_a_link_is_refused(tmp_path: Path, catalogue: Catalogue) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    records = []
    for n, record in enumerate(catalogue.records[:4]):
        copy = photos / f"f{n}.png"
        shutil.copy(record.image, copy)
        records.append(dataclasses.replace(record, image=copy))
    write_version(tmp_path / "indexes", dataclasses.replace(catalogue, records=records))
    secret = tmp_path / "secret" / "passwd"
    secret.parent.mkdir()
    secret.write_bytes(SECRET)
    # After indexing: one file becomes a link out of its folder, one a link to its neighbour, one a FIFO.
    (photos / "f0.png").unlink()
    os.symlink(secret, photos / "f0.png")
    (photos / "f1.png").unlink()
    os.symlink("f2.png", photos / "f1.png")
    (photos / "f3.png").unlink()
    os.mkfifo(photos / "f3.png")
    ids = [r.id for r in records]
    with LiveServer(make_settings(tmp_path / "indexes")) as live, live.client() as client:
        for url in (f"/v1/images/{ids[0]}", f"/v1/images?id={ids[0]}", f"/v1/images/{ids[0]}?size=64"):
            answer = client.get(url)
            assert answer.status_code == 403, (url, answer.status_code)
            assert b"root:" not in answer.content
            (error,) = answer.json()["detail"]
            assert error["loc"] == ["path", "item_id"] and "link out of its folder" in error["msg"]
        neighbour = client.get(f"/v1/images/{ids[1]}")
        assert neighbour.status_code == 200
        assert neighbour.content == (photos / "f2.png").read_bytes()
        assert neighbour.headers["content-type"] == "image/png"
        assert neighbour.headers["content-length"] == str((photos / "f2.png").stat().st_size)
        plain = client.get(f"/v1/images/{ids[2]}")
        assert plain.status_code == 200 and plain.content == (photos / "f2.png").read_bytes()
        assert "etag" in plain.headers and plain.headers["cache-control"] == "public, max-age=3600"
        fifo = client.get(f"/v1/images/{ids[3]}", timeout=10)
        assert fifo.status_code == 403 and "not a regular file" in fifo.text


def test_a_parent_folder_swapped_for_a_link_is_refused(tmp_path: Path, catalogue: Catalogue) -> None:
    """``O_NOFOLLOW`` guards the last component only: ``sub`` swapped for a link to another folder after
    indexing served ``sub/inner.png`` from there. Links above the photo folder (the folder reached through
    a link, as ``/home -> /data/home``) are the machine's, and still followed."""
    photos = tmp_path / "photos"
    for folder in ("sub", "deep/er"):
        (photos / folder).mkdir(parents=True)
    alias = tmp_path / "alias"  # the photo folder, indexed through a link to it
    os.symlink(photos, alias)
    records = []
    for rel, record in zip(("sub/inner.png", "deep/er/kept.png"), catalogue.records, strict=False):
        shutil.copy(record.image, photos / rel)
        records.append(dataclasses.replace(record, id=rel, image=alias / rel))
    write_version(tmp_path / "indexes", dataclasses.replace(catalogue, records=records))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "inner.png").write_bytes(SECRET)
    shutil.rmtree(photos / "sub")
    os.symlink(outside, photos / "sub")
    with LiveServer(make_settings(tmp_path / "indexes")) as live, live.client() as client:
        for url in ("/v1/images?id=sub/inner.png", "/v1/images?id=sub/inner.png&size=64"):
            answer = client.get(url)
            assert answer.status_code == 403, (url, answer.status_code)
            assert b"root:" not in answer.content
            (error,) = answer.json()["detail"]
            assert error["loc"] == ["path", "item_id"] and "is a link" in error["msg"]
        kept = client.get("/v1/images?id=deep/er/kept.png")
        assert kept.status_code == 200 and kept.content == (photos / "deep/er/kept.png").read_bytes()


def test_a_16_bit_greyscale_thumbnail_keeps_its_grey(tmp_path: Path, catalogue: Catalogue) -> None:
    scan = tmp_path / "scan.png"
    Image.fromarray(np.full((300, 200), 30_000, dtype=np.uint16)).save(scan)  # mode I;16
    records = [dataclasses.replace(catalogue.records[0], image=scan), *catalogue.records[1:3]]
    write_version(tmp_path / "indexes", dataclasses.replace(catalogue, records=records))
    with LiveServer(make_settings(tmp_path / "indexes")) as live, live.client() as client:
        answer = client.get(f"/v1/images/{records[0].id}", params={"size": 64})
    assert answer.status_code == 200 and answer.headers["content-type"] == "image/jpeg"
    thumb = Image.open(io.BytesIO(answer.content))
    assert thumb.size == (43, 64)
    grey = np.asarray(thumb.convert("RGB"), dtype=np.int32)
    assert np.abs(grey - round(30_000 / 257)).max() <= 2  # 117, not white


def test_ids_dot_and_long_ids_get_working_image_links(tmp_path: Path, catalogue: Catalogue) -> None:
    """Ids the indexer takes: ``.`` and ``..`` (clients drop such path segments) and a 600-character id
    (over the routes' old 512 limit) were indexed, but their image links answered 422."""
    long_id = "x" * 600
    records = list(catalogue.records[:4])
    for n, item_id in enumerate((".", "..", long_id)):
        records[n] = dataclasses.replace(records[n], id=item_id)
    write_version(tmp_path, dataclasses.replace(catalogue, records=records))
    with LiveServer(make_settings(tmp_path)) as live, live.client() as client:
        hits = client.post("/v1/search", json={"query": records[0].captions["en"][0], "top_k": 60}).json()
        urls = {hit["id"]: hit["image_url"] for hit in hits["results"]}
        assert urls["."] == "/v1/images?id=." and urls[".."] == "/v1/images?id=.."
        assert urls[long_id] == f"/v1/images/{long_id}"
        for n, item_id in enumerate((".", "..", long_id)):
            for url in (urls[item_id], f"{urls[item_id]}{'&' if '?' in urls[item_id] else '?'}size=32"):
                answer = client.get(url)
                assert answer.status_code == 200, (item_id[:10], url[:40], answer.text[:200])
            assert client.get(urls[item_id]).content == Path(records[n].image).read_bytes()


def test_a_large_thumbnail_is_reduced_first_and_keeps_its_colour(tmp_path: Path) -> None:
    from service.item_images import thumbnail

    path = tmp_path / "large.png"
    Image.new("RGB", (1000, 800), (200, 30, 90)).save(path)
    with open(path, "rb") as file:
        thumb = Image.open(io.BytesIO(thumbnail(file, 64)))
    assert thumb.size == (64, 51)
    assert np.abs(np.asarray(thumb, dtype=np.int32) - (200, 30, 90)).max() <= 3
