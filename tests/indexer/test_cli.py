"""``ccrk index ...`` end to end through the console app: summaries, exit codes, messages naming files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ccrk_cli.main import app
from ccrk_settings import Settings, get_settings
from indexer.build import build
from monitoring.gate import quality_gate
from store.layout import is_version_name
from store.opening import open_version
from store.version.reader import IndexVersion
from store.version.versions import current_version, list_versions, version_refused
from tests.indexer.files import write_photo

runner = CliRunner()


def _run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["index", *args])
    return result.exit_code, result.output


def _shifted_catalogue(catalogue: Path, out: Path, shift: int) -> Path:
    """The catalogue with absolute image paths; ``shift`` > 0 gives every record another record's image
    (a degraded build the quality gate must refuse)."""
    records = [json.loads(line) for line in (catalogue / "test.jsonl").read_text().splitlines() if line]
    with open(out, "w", encoding="utf-8") as fh:
        for i, rec in enumerate(records):
            rec["image"] = str(catalogue / records[(i + shift) % len(records)]["image"])
            fh.write(json.dumps(rec) + "\n")
    return out


def _table_rows(out: str) -> dict[str, str]:
    """Version -> its row of the `ccrk index list` table (the first version name in a row is its own; the
    parent column names another)."""
    rows = {}
    for line in out.splitlines():
        names = [word for word in line.split() if is_version_name(word)]
        if names:
            rows[names[0]] = line
    return rows


def test_build_list_delete_rollback_verify(tmp_path: Path, photo_folder: Path) -> None:
    root = str(tmp_path / "idx")
    common = ["--name", "shop", "--index-root", root]
    code, out = _run("build", *common, "--threads", "1", "--workers", "0", "--rerank-dtype", "int8",
                     "--json-report", str(tmp_path / "r.json"), str(photo_folder))  # fmt: skip
    assert code == 0, out
    assert "(published)" in out and "items/s" in out and "bytes/image" in out
    report = json.loads((tmp_path / "r.json").read_text())
    # int8 tokens plus one float32 scale per token: 65 * 128 + 65 * 4 bytes.
    assert report["count"] == 12 and report["rerank_bytes_per_image"] == 65 * 128 + 65 * 4
    first = report["version"]

    code, out = _run("delete", *common, "p0.jpg", "sub/a.png")
    assert code == 0 and "10" in out
    code, out = _run("list", *common)
    assert code == 0 and first in out
    assert len(list_versions(tmp_path / "idx", "shop")) == 2
    code, out = _run("verify", *common)
    assert code == 0 and "OK" in out

    code, out = _run("delete", *common, "not-there")
    assert code == 2 and "'not-there'" in out

    code, out = _run("rollback", *common)
    assert code == 0 and current_version(tmp_path / "idx", "shop") == first

    # A corrupted file is reported by verify with exit code 1.
    emb = tmp_path / "idx" / "shop" / first / "embeddings.npy"
    data = bytearray(emb.read_bytes())
    data[-1] ^= 1
    emb.write_bytes(bytes(data))
    code, out = _run("verify", *common)
    assert code == 1 and "embeddings.npy: checksum mismatch" in out


def test_verify_without_model_uses_the_model_the_manifest_names(tmp_path: Path, photo_folder: Path) -> None:
    """An index built with another model (``make photos``: the starter) failed ``verify`` without
    ``--model``: it was checked against the default model. Now the model the manifest records is named,
    and checked when given."""
    from ccrk_settings import DEFAULT_MODEL_DIR

    root = tmp_path / "idx"
    common = ["--name", "shop", "--index-root", str(root)]
    code, out = _run("build", *common, "--threads", "1", "--workers", "0", str(photo_folder))
    assert code == 0, out
    version = current_version(root, "shop")
    assert version is not None
    code, out = _run("verify", *common)  # built with the default model: checked against it
    assert code == 0 and "OK (checksums, counts, model)" in out, out
    # As a build with the starter records it (its folder name, its weights' fingerprint).
    manifest_file = root / "shop" / version / "manifest.json"
    manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    manifest.update(model_name="ccrk-starter", model_fingerprint="5a" * 32)
    manifest_file.write_text(json.dumps(manifest), encoding="utf-8")
    code, out = _run("verify", *common)
    assert code == 0, out
    assert "OK (checksums, counts)" in out and "model not checked" in out and "'ccrk-starter'" in out
    code, out = _run("verify", *common, "--model", str(DEFAULT_MODEL_DIR))  # asked for: checked
    assert code == 1 and "was built with model 'ccrk-starter'" in out, out


def test_text_fields_option(tmp_path: Path, catalogue: Path) -> None:
    """--text-fields: a bad field name names the option (with --shards: test_sharded_products.py)."""
    common = ["--name", "x", "--index-root", str(tmp_path), str(catalogue / "test.jsonl")]
    code, out = _run("build", "--text-fields", 'ti"tle', *common)
    assert code == 2 and "--text-fields" in out
    code, out = _run("build", "--text-fields", "title@de", *common)
    assert code == 2 and "--text-fields" in out
    assert not (tmp_path / "x").exists()  # refused before any work


def test_bad_sources_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "shop.csv"
    bad.write_text("id,title\n1,x\n")
    code, out = _run("build", "--name", "x", "--index-root", str(tmp_path), str(bad))
    assert code == 2 and "shop.csv" in out and "path" in out
    code, out = _run("build", "--name", "x", "--index-root", str(tmp_path), str(tmp_path / "nope"))
    assert code == 2 and "source not found" in out
    code, out = _run("list", "--name", "x", "--index-root", str(tmp_path))
    assert code == 2 and "no versions" in out
    # An index root that cannot be created: the path and the reason, not a traceback.
    (tmp_path / "taken").write_text("a file, not a folder")
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(b"")
    result = runner.invoke(
        app,
        ["index", "build", "--name", "x", "--index-root", str(tmp_path / "taken"), str(photos)],
        env={"COLUMNS": "300"},
    )
    assert result.exit_code == 2, result.output
    # The first path under it the build touches (CURRENT, read for reuse, or the work folder), and why.
    assert f"error: {tmp_path / 'taken' / 'x'}/" in result.output and ": Not a directory" in result.output
    assert "Traceback" not in result.output


def test_an_error_names_a_long_bracketed_path_whole(tmp_path: Path) -> None:
    """A path longer than the console (80 columns when not a terminal) with rich markup in its name: named
    whole on one line, brackets kept. It was wrapped mid-path, a ``[bold]`` in a name vanished and a ``[/b]``
    raised rich's MarkupError (a traceback instead of the message)."""
    folder = tmp_path / ("a-rather-long-folder-name-" * 3) / "shop[/b][bold]"
    folder.mkdir(parents=True)
    bad = folder / "rows.csv"
    bad.write_text("id,title\n1,x\n")
    code, out = _run("build", "--name", "x", "--index-root", str(tmp_path / "root"), str(bad))
    assert code == 2, out
    assert str(bad) in out.replace("\n", "") and str(bad) in out, out
    assert "Traceback" not in out


def test_refused_build_is_marked_and_not_rolled_back_to(
    settings: Settings, catalogue: Path, tmp_path: Path
) -> None:
    """Real builds with the quality gate on: a good one, a degraded one (refused, kept), a good one again.
    `ccrk index list` marks CURRENT and the refused version; rollback skips it unless --to it with --force."""
    gated = settings.model_copy(
        update={
            "redis_url": None,
            "history_db": tmp_path / "history.sqlite",
            "gate_min_recall_at_10": 0.5,
            "gate_probe_size": 30,
            "probe_depth": 20,
            "index_batch_size": 40,
            "shard_size": 64,
            "index_workers": 0,
        }
    )
    good_src = _shifted_catalogue(catalogue, tmp_path / "good.jsonl", 0)
    good = build("shop", [good_src], settings=gated, gate=quality_gate)
    bad = build(
        "shop", [_shifted_catalogue(catalogue, tmp_path / "bad.jsonl", 7)], settings=gated, gate=quality_gate
    )
    # The good build's result is still CURRENT: re-running it is a no-op, --force builds a new version.
    same = build("shop", [good_src], settings=gated, gate=quality_gate)
    assert same.already_current and not same.published and same.version == good.version
    again = build("shop", [good_src], settings=gated, force=True, gate=quality_gate)
    assert good.published and not bad.published and again.published, (good.notes, bad.notes)
    root = gated.index_root
    assert list_versions(root, "shop") == [good.version, bad.version, again.version]
    assert version_refused(root, "shop", bad.version)
    assert not version_refused(root, "shop", good.version)

    common = ["--name", "shop", "--index-root", str(root)]
    result = runner.invoke(app, ["index", "list", *common], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    rows = _table_rows(result.output)
    assert set(rows) >= {good.version, bad.version, again.version}
    assert "refused by gate" in rows[bad.version] and "CURRENT" not in rows[bad.version]
    assert "CURRENT" in rows[again.version] and "*" in rows[again.version]
    assert "refused" not in rows[good.version] and "CURRENT" not in rows[good.version]

    code, out = _run("rollback", *common)
    assert code == 0, out
    assert current_version(root, "shop") == good.version  # not the refused version in between
    code, out = _run("rollback", *common, "--to", bad.version)
    assert code == 2 and "refused by the quality gate" in out and "--force" in out
    assert current_version(root, "shop") == good.version
    code, out = _run("rollback", *common, "--to", bad.version, "--force")
    assert code == 0 and current_version(root, "shop") == bad.version
    assert "published with --force" in " ".join(out.split())


def test_links_out_of_a_folder_are_reported_not_indexed(
    tmp_path: Path, photo_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link to a file outside the indexed folder is listed in the summary and the JSON report, and is
    not in the index (the service would serve it); CCRK_FOLLOW_EXTERNAL_LINKS=true indexes it."""
    secret = write_photo(tmp_path / "private" / "secret.jpg", 7)
    (photo_folder / "sub" / "out.jpg").symlink_to(secret)
    root = tmp_path / "idx"
    common = ["build", "--name", "shop", "--index-root", str(root), "--threads", "1", "--workers", "0"]
    result = runner.invoke(
        app,
        ["index", *common, "--json-report", str(tmp_path / "r.json"), str(photo_folder)],
        env={"COLUMNS": "250"},
    )
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "skipped links │ 1 (symbolic links not followed)" in out
    link = photo_folder / "sub" / "out.jpg"
    assert f"skipped link {link} -> {os.path.realpath(secret)}: leads outside the source folder" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert [s["path"] for s in report["skipped_links"]] == [str(link)] and report["count"] == 12
    with IndexVersion.open(root, "shop") as idx:
        assert idx.row_of("sub/out.jpg") is None

    monkeypatch.setenv("CCRK_FOLLOW_EXTERNAL_LINKS", "true")
    get_settings.cache_clear()
    try:
        code, out = _run(*common, "--json-report", str(tmp_path / "r2.json"), str(photo_folder))
    finally:
        get_settings.cache_clear()
    assert code == 0, out
    report = json.loads((tmp_path / "r2.json").read_text())
    assert report["skipped_links"] == [] and report["count"] == 13
    with open_version(root, "shop") as idx:  # one more item: a segmented version (indexer.segments)
        assert idx.items([idx.row_of("sub/out.jpg")])[0]["path"] == str(link)


@pytest.mark.parametrize(
    ("suffix", "line", "message"),
    [
        # A lone surrogate (a JSON escape): it used to be a UnicodeEncodeError in indexer/disk.py.
        (".jsonl", b'{"id": "b", "path": "b.jpg", "title": "caf\\ud800"}', "field 'title': a lone surrogate"),
        # Bytes that are not UTF-8: a UnicodeDecodeError in indexer/sources.py.
        (
            ".jsonl",
            b'{"id": "b", "path": "b.jpg", "title": "caf\xe9"}',
            "invalid UTF-8 (byte 0xe9) at column",
        ),
        (".csv", b"b,b.jpg,caf\xff\n", "field 'title': invalid UTF-8 (byte 0xff)"),
        # NaN and Infinity (JSON has neither): "malformed JSON" from SQLite at index creation.
        (".jsonl", b'{"id": "b", "path": "b.jpg", "price": NaN}', "field 'price': NaN is not a number"),
        (".jsonl", b'{"id": "b", "path": "b.jpg", "a": {"b": [1, -Infinity]}}', "field 'a.b[1]': -Infinity"),
        (".jsonl", b'{"id": "b", "path": "b.jpg", "price": 1e999}', "field 'price': 1e999 is not a number"),
    ],
)
def test_a_manifest_value_the_index_cannot_hold_exits_2_naming_line_and_field(
    tmp_path: Path, suffix: str, line: bytes, message: str
) -> None:
    write_photo(tmp_path / "a.jpg", 1)
    write_photo(tmp_path / "b.jpg", 2)
    manifest = tmp_path / f"shop{suffix}"
    if suffix == ".csv":
        manifest.write_bytes(b"id,path,title\na,a.jpg,fine\n" + line)
    else:
        manifest.write_bytes(b'{"id": "a", "path": "a.jpg", "title": "fine"}\n' + line + b"\n")
    root = tmp_path / "idx"
    result = runner.invoke(
        app,
        ["index", "build", "--name", "x", "--index-root", str(root), str(manifest)],
        env={"COLUMNS": "300"},
    )
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    lineno = 3 if suffix == ".csv" else 2  # the CSV's header is its first line
    assert f"{manifest}:{lineno}: " in out and message in out, out
    assert "Traceback" not in out
    assert current_version(root, "x") is None


def test_text_fields_no_row_holds_exit_2_naming_them(tmp_path: Path) -> None:
    """It used to publish an image-only index without a word."""
    write_photo(tmp_path / "a.jpg", 1)
    manifest = tmp_path / "shop.jsonl"
    manifest.write_text('{"id": "a", "path": "a.jpg", "title@de": "Apfel", "price": 1}\n')
    root = tmp_path / "idx"
    common = ["--name", "x", "--index-root", str(root), "--threads", "1", "--workers", "0"]
    result = runner.invoke(
        app, ["index", "build", *common, "--text-fields", "title,colour,size", str(manifest)],
        env={"COLUMNS": "300"},
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    assert "--text-fields (CCRK_TEXT_FIELDS) names 'colour', 'size', which no row of" in out, out
    assert "(their fields: price, title)" in out  # title@de holds title
    assert current_version(root, "x") is None
