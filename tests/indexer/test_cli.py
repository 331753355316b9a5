"""``ccrk index ...`` end to end through the console app: summaries, exit codes, messages naming files."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from ccrk_cli.main import app
from indexer import index_format as fmt

runner = CliRunner()


def _run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["index", *args])
    return result.exit_code, result.output


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
    assert len(fmt.list_versions(tmp_path / "idx", "shop")) == 2
    code, out = _run("verify", *common)
    assert code == 0 and "OK" in out

    code, out = _run("delete", *common, "not-there")
    assert code == 2 and "'not-there'" in out

    code, out = _run("rollback", *common)
    assert code == 0 and fmt.current_version(tmp_path / "idx", "shop") == first

    # A corrupted file is reported by verify with exit code 1.
    emb = tmp_path / "idx" / "shop" / first / "embeddings.npy"
    data = bytearray(emb.read_bytes())
    data[-1] ^= 1
    emb.write_bytes(bytes(data))
    code, out = _run("verify", *common)
    assert code == 1 and "embeddings.npy: checksum mismatch" in out


def test_bad_sources_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "shop.csv"
    bad.write_text("id,title\n1,x\n")
    code, out = _run("build", "--name", "x", "--index-root", str(tmp_path), str(bad))
    assert code == 2 and "shop.csv" in out and "path" in out
    code, out = _run("build", "--name", "x", "--index-root", str(tmp_path), str(tmp_path / "nope"))
    assert code == 2 and "source not found" in out
    code, out = _run("list", "--name", "x", "--index-root", str(tmp_path))
    assert code == 2 and "no versions" in out
