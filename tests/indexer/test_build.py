"""Builds with the shipped demo model (ONNX Runtime, one thread) on tiny real collections: folder and
manifest inputs with metadata, bad files, add/delete/rollback, recall against exact search, model
mismatch, and a reader opening CURRENT while builds publish."""

from __future__ import annotations

import csv
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from indexer.build import add, build, delete, rollback
from indexer.decode import BAD_KINDS
from indexer.errors import BuildError, TooManyBadItemsError
from model.configs import CCRkConfig
from model.preprocessing import ImagePreprocessor
from model.runtime import Encoder
from store.errors import ModelMismatchError
from store.verify import verify_version
from store.version.manifest import model_fingerprint, model_name_of
from store.version.reader import IndexVersion
from store.version.versions import current_version, list_versions, publish_version
from tests.indexer.files import copy_model, make_bad_files
from tests.store.writing import write_version


def _records(catalogue: Path) -> list[dict]:
    return [json.loads(line) for line in (catalogue / "test.jsonl").read_text().splitlines() if line.strip()]


def _subset(catalogue: Path, out: Path, ids: slice) -> Path:
    """A catalogue jsonl with a slice of the records (absolute image paths)."""
    lines = []
    for rec in _records(catalogue)[ids]:
        rec["image"] = str(catalogue / rec["image"])
        lines.append(json.dumps(rec))
    out.write_text("\n".join(lines) + "\n")
    return out


def _direct(encoder: Encoder, paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    pre = ImagePreprocessor(CCRkConfig.load(DEFAULT_MODEL_DIR / "config.json").vision)
    out = encoder.encode_images(np.stack([pre.load_uint8(p) for p in paths]))
    return out.embeds, out.tokens


def test_folder_build_matches_direct_encoding(
    settings: Settings, photo_folder: Path, encoder: Encoder
) -> None:
    report = build("photos", [photo_folder], settings=settings)
    assert report.published and report.count == 12 and report.skipped == [] and report.ignored_files == 1
    assert report.shards == 2 and report.resumed_shards == 0
    with IndexVersion.open(settings.index_root, "photos") as idx:
        m = idx.manifest
        assert m.model_name == "ccrk-demo" and m.model_fingerprint == model_fingerprint(DEFAULT_MODEL_DIR)
        assert m.embed_dim == 128 and m.preprocessing["image_size"] == 64 and m.index_factory == "Flat"
        assert m.rerank == {"dtype": "fp16", "tokens": 65, "width": 128, "bytes_per_image": 65 * 128 * 2}
        assert set(m.checksums) == {
            "index.faiss", "embeddings.npy", "rerank_tokens.npy", "metadata.sqlite",
            "image_digests.npy", "row_digests.npy", "image_stats.npy",  # what a rebuild reuses rows by
        }  # fmt: skip
        assert m.measured_recall_at_10 == 1.0 and m.language_recall_at_10 == {}
        items = idx.items(range(12))
        paths = [Path(it["path"]) for it in items]
        assert items[4]["id"] == "sub/a.png" and paths[4] == photo_folder / "sub" / "a.png"
        embeds, tokens = _direct(encoder, paths)
        np.testing.assert_allclose(np.load(idx.path / "embeddings.npy"), embeds, atol=1e-5)
        np.testing.assert_allclose(idx.rerank_tokens(np.arange(12)), tokens, atol=2e-3 * np.abs(tokens).max())
        # Each photo's own embedding finds itself first.
        _, rows = idx.search(embeds, 1)
        np.testing.assert_array_equal(rows[:, 0], np.arange(12))
    assert verify_version(settings.index_root, "photos", model_dir=DEFAULT_MODEL_DIR) == []


def test_manifest_inputs_with_metadata_and_filters(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    recs = _records(catalogue)
    csv_path = tmp_path / "shop.csv"
    with open(csv_path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "path", "title", "category", "price", "brand"])
        for i, rec in enumerate(recs[:20]):
            # Relative to the manifest's folder.
            rel = Path("../" + catalogue.name) / rec["image"]
            writer.writerow(
                [f"sku-{i}", str(rel), f"item {i}", rec["attributes"]["category"], 10 + i, "acme"]
            )
    assert (tmp_path / ".." / catalogue.name).is_dir()  # the pytest temp folders are siblings
    jsonl_path = tmp_path / "more.jsonl"
    jsonl_path.write_text(
        "".join(
            json.dumps(
                {"id": f"j-{i}", "path": str(catalogue / rec["image"]), "price": 100.5 + i, "brand": "zeta"}
            )
            + "\n"
            for i, rec in enumerate(recs[20:30])
        )
    )
    report = build("shop", [csv_path, jsonl_path], settings=settings)
    assert report.count == 30 and report.skipped == []
    with IndexVersion.open(settings.index_root, "shop") as idx:
        assert idx.fields == {"title", "category", "price", "brand"}
        assert idx.items([idx.row_of("sku-3")]) == [
            {
                "id": "sku-3",
                "path": str(catalogue / recs[3]["image"]),
                "title": "item 3",
                "category": recs[3]["attributes"]["category"],
                "price": 13,
                "brand": "acme",
            }
        ]
        cheap = idx.filter_rows({"price": {"lt": 15}})
        assert [idx.items([r])[0]["id"] for r in cheap] == [f"sku-{i}" for i in range(5)]
        zeta = idx.filter_rows({"brand": "zeta", "price": {"gte": 105}})
        assert sorted(idx.items(zeta)[i]["id"] for i in range(len(zeta))) == [f"j-{i}" for i in range(5, 10)]
        q = np.load(idx.path / "embeddings.npy")[:3]
        _, rows = idx.search(q, 10, allowed_rows=zeta)
        assert set(rows[rows >= 0].tolist()) <= set(zeta.tolist()) and (rows[:, :5] >= 0).all()


def test_catalogue_build_measures_language_recall(
    settings: Settings, catalogue: Path, encoder: Encoder
) -> None:
    build("cat", [catalogue / "test.jsonl"], settings=settings)
    recs = _records(catalogue)
    with IndexVersion.open(settings.index_root, "cat") as idx:
        recall = idx.manifest.language_recall_at_10
        assert sorted(recall) == sorted(recs[0]["captions"]) and len(recall) == 10
        # Recomputed here for two languages with exact search (the index is exact at 40 items).
        for lang in ("en", "ja"):
            q = encoder.encode_text([r["captions"][lang][0] for r in recs]).embeds
            _, rows = idx.search_exact(q, 10)
            want = np.mean([idx.row_of(r["id"]) in found for r, found in zip(recs, rows, strict=True)])
            assert recall[lang] == pytest.approx(want, abs=1e-4)
        assert idx.manifest.build_params["tuning_queries"] == "captions"


def test_bad_files_are_skipped_with_reasons_or_fail_the_build(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    bad = make_bad_files(tmp_path / "bad")
    good = _subset(catalogue, tmp_path / "good.jsonl", slice(0, 40))
    manifest = tmp_path / "bad.jsonl"
    manifest.write_text("".join(json.dumps({"id": k, "path": str(p)}) + "\n" for k, p in bad.items()))
    lenient = settings.model_copy(update={"max_image_pixels": 1_000_000, "max_bad_fraction": 0.2})
    report = build("mixed", [good, manifest], settings=lenient)
    assert report.published and report.count == 40
    assert {s["id"]: s["kind"] for s in report.skipped} == {k: k for k in BAD_KINDS}
    with IndexVersion.open(settings.index_root, "mixed") as idx:
        assert {s["kind"] for s in idx.manifest.skipped} == set(BAD_KINDS)
        assert all(s["reason"].startswith(s["kind"]) and s["source"] for s in idx.manifest.skipped)
        assert idx.row_of("truncated") is None
    published = current_version(settings.index_root, "mixed")
    # 6 bad of 45 (13 %) is over the default 5 %: the build fails and the good index stays published.
    strict = settings.model_copy(update={"max_image_pixels": 1_000_000})
    with pytest.raises(TooManyBadItemsError, match=r"(?s)6 of 45 items are bad.*truncated\.jpg"):
        build("mixed", [_subset(catalogue, tmp_path / "g2.jsonl", slice(0, 39)), manifest], settings=strict)
    assert current_version(settings.index_root, "mixed") == published
    assert list_versions(settings.index_root, "mixed") == [published]


def test_add_delete_rollback(settings: Settings, catalogue: Path, tmp_path: Path) -> None:
    root = settings.index_root
    first = build("shop", [_subset(catalogue, tmp_path / "a.jsonl", slice(0, 30))], settings=settings)
    added = add("shop", [_subset(catalogue, tmp_path / "all.jsonl", slice(0, 40))], settings=settings)
    assert added.items_total == 10 and added.already_indexed == 30 and added.count == 40
    assert current_version(root, "shop") == added.version
    with IndexVersion.open(root, "shop", first.version) as v1, IndexVersion.open(root, "shop") as v2:
        e1, e2 = np.load(v1.path / "embeddings.npy"), np.load(v2.path / "embeddings.npy")
        np.testing.assert_array_equal(e2[:30], e1)  # old rows kept as they were, not re-encoded
        assert v2.manifest.parent_version == first.version and v2.row_of("test-000035") == 35
        assert not np.array_equal(e2[30:], np.zeros_like(e2[30:]))
    gone = ["test-000004", "test-000033"]
    deleted = delete("shop", gone, settings=settings)
    assert deleted.count == 38
    with IndexVersion.open(root, "shop") as v3:
        emb = np.load(v3.path / "embeddings.npy")
        assert len(v3) == 38 and v3.row_of("test-000004") is None
        for q in (v3.search, v3.search_exact):
            _, rows = q(emb[[4, 33]], 40)
            assert not np.isin(rows, [4, 33]).any() and (rows[:, :38] >= 0).all()
        # Unchanged files are shared with the parent version, not copied.
        assert (v3.path / "embeddings.npy").stat().st_ino == (
            root / "shop" / added.version / "embeddings.npy"
        ).stat().st_ino
    with pytest.raises(BuildError, match="'nope'"):
        delete("shop", ["test-000001", "nope"], settings=settings)
    assert current_version(root, "shop") == deleted.version
    back = rollback("shop", settings=settings)
    assert back.version == added.version and current_version(root, "shop") == added.version
    with IndexVersion.open(root, "shop") as idx:
        assert idx.row_of("test-000004") == 4
    rollback("shop", settings=settings, to=first.version)
    assert current_version(root, "shop") == first.version
    with pytest.raises(BuildError, match="no version before"):
        rollback("shop", settings=settings)
    # Adding after a delete brings a deleted id back as a new row.
    publish_version(root, "shop", deleted.version)
    again = add("shop", [tmp_path / "all.jsonl"], settings=settings)
    assert again.items_total == 2 and again.count == 40
    with IndexVersion.open(root, "shop") as idx:
        assert idx.row_of("test-000004") == 40 and idx.total_rows == 42
    assert len(list_versions(root, "shop")) == settings.keep_versions


def test_rollback_skips_versions_the_gate_refused(settings: Settings) -> None:
    """History of a gated index: g1, g2 published, r1 refused (CURRENT stayed g2), g3 published, r2 refused.
    Versions written through the format module, verdicts as the builder records them."""
    root = settings.index_root

    def version(gate: bool) -> str:
        return write_version(root, "shop", n=20, gate=gate, publish=gate)

    g1, g2, r1, g3, r2 = (version(gate) for gate in (True, True, False, True, False))
    assert current_version(root, "shop") == g3
    # The default target is the newest approved version before CURRENT: g2, not the refused r1.
    assert rollback("shop", settings=settings).version == g2
    assert current_version(root, "shop") == g2
    assert rollback("shop", settings=settings).version == g1
    with pytest.raises(BuildError, match="no version before"):
        rollback("shop", settings=settings)
    assert current_version(root, "shop") == g1

    # --to a refused version: refused with its reasons unless forced; CURRENT unchanged.
    with pytest.raises(BuildError, match=f"{r1} .* refused by the quality gate.*test verdict.*--force"):
        rollback("shop", settings=settings, to=r1)
    assert current_version(root, "shop") == g1
    forced = rollback("shop", settings=settings, to=r1, force=True)
    assert current_version(root, "shop") == r1 and any("--force" in n for n in forced.notes)
    # From a forced refused CURRENT, the default goes back to the newest approved one before it.
    assert rollback("shop", settings=settings).version == g2
    # Later approved versions are reachable with --to, refused ones never by default.
    assert rollback("shop", settings=settings, to=g3).version == g3
    assert list_versions(root, "shop") == [g1, g2, r1, g3, r2]


def test_rollback_with_only_refused_versions_before_current(settings: Settings) -> None:
    root = settings.index_root
    refused = write_version(root, "shop", n=20, gate=False, publish=False)
    good = write_version(root, "shop", n=20, gate=True)
    with pytest.raises(BuildError, match=f"no version before {good}.*refused by the quality gate.*{refused}"):
        rollback("shop", settings=settings)
    assert current_version(root, "shop") == good


@pytest.mark.parametrize(("factory", "kind"), [(None, "hnsw"), ("IVF4,SQ8", "ivf")])
def test_ann_recall_against_exact_search(
    settings: Settings, catalogue: Path, encoder: Encoder, factory: str | None, kind: str
) -> None:
    # exact_max_items below the collection size, so the automatic choice is an ANN index.
    small = settings.model_copy(update={"exact_max_items": 10})
    report = build("ann", [catalogue / "test.jsonl"], settings=small, index_factory=factory)
    recs = _records(catalogue)
    with IndexVersion.open(settings.index_root, "ann") as idx:
        assert idx.index_kind == kind
        assert report.index_factory == (factory or "HNSW32,Flat")
        assert idx.manifest.measured_recall_at_10 >= settings.target_recall
        assert ("efSearch" if kind == "hnsw" else "nprobe") in idx.manifest.search_params
        # Fresh queries (second phrasing of each caption, every language) against exact search.
        texts = [caps[1] for r in recs for caps in r["captions"].values()]
        q = encoder.encode_text(texts).embeds
        scores, rows = idx.search(q, 10)
        _, exact = idx.search_exact(q, 10)
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, exact, strict=True)])
        assert recall >= settings.target_recall
        emb = np.load(idx.path / "embeddings.npy")
        np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", q, emb[rows]), atol=1e-5)


def test_model_mismatch_is_refused(settings: Settings, catalogue: Path, tmp_path: Path) -> None:
    build("shop", [_subset(catalogue, tmp_path / "a.jsonl", slice(0, 10))], settings=settings)
    published = current_version(settings.index_root, "shop")
    other = copy_model(tmp_path, "ccrk-other")
    with pytest.raises(ModelMismatchError, match=r"'ccrk-demo'.*ccrk-other"):
        IndexVersion.open(
            settings.index_root,
            "shop",
            expect_fingerprint=model_fingerprint(other),
            expect_model_name=model_name_of(other),
        )
    with pytest.raises(ModelMismatchError, match=r"'ccrk-demo'"):
        add("shop", [tmp_path / "a.jsonl"], settings=settings, model_dir=other)
    assert current_version(settings.index_root, "shop") == published
    problems = verify_version(settings.index_root, "shop", model_dir=other)
    assert len(problems) == 1 and "ccrk-demo" in problems[0] and "ccrk-other" in problems[0]


def test_reader_opens_current_while_builds_publish(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    # In-process decoding: no fork while the reader thread runs; keep 2 versions so pruning happens too.
    # Every build compacts (one unsharded version each, not a segment: ``indexer.segments``).
    live = settings.model_copy(update={"index_workers": 0, "keep_versions": 2, "index_segment_max_dead": 0.0})
    sources = [_subset(catalogue, tmp_path / f"s{i}.jsonl", slice(0, 20 + 5 * i)) for i in range(4)]
    build("live", [sources[0]], settings=live)
    stop = threading.Event()
    seen: set[str] = set()
    errors: list[BaseException] = []
    opened = 0

    def reader() -> None:
        nonlocal opened
        while not stop.is_set():
            try:
                with IndexVersion.open(live.index_root, "live") as idx:
                    assert len(idx) == idx.manifest.count == idx.total_rows
                    q = np.asarray(np.load(idx.path / "embeddings.npy", mmap_mode="r")[:2])
                    _, rows = idx.search(q, 5)
                    assert rows[0, 0] == 0 and rows[1, 0] == 1
                    assert len(idx.items(rows[0])) == 5 and idx.rerank_tokens(rows[0]).shape == (5, 65, 128)
                    seen.add(idx.manifest.version)
                    opened += 1
            except BaseException as exc:
                errors.append(exc)
                return

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for src in sources[1:]:
            build("live", [src], settings=live)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert opened > 5 and len(seen) >= 2
    assert len(list_versions(live.index_root, "live")) == 2
