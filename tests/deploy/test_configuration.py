"""The configuration reference (deploy/CONFIGURATION.md) is the Settings class written out, and every
CCRK_ variable the project names anywhere is a setting; `ccrk config` prints and checks them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ccrk_cli.main import app
from ccrk_settings import Settings, get_settings
from ccrk_settings.reference import env_names, reference
from tests.deploy.deployment import REPO

DOC = REPO / "deploy" / "CONFIGURATION.md"
# A variable name, not a prefix mentioned as a family (CCRK_GATE_*).
NAME = re.compile(r"\bCCRK_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])")
SCANNED_DIRS = (
    "ccrk_cli",
    "ccrk_settings",
    "indexer",
    "monitoring",
    "service",
    "model",
    "store",
    "synthetic",
    "deploy",
    "bench",
    ".ci",
    "docs",
)
SCANNED_FILES = (
    "Dockerfile",
    "Dockerfile.gpu",
    "Dockerfile.ray",
    "docker-compose.yml",
    "Makefile",
    "README.md",
    ".dockerignore",
)
SUFFIXES = {".py", ".md", ".yml", ".yaml", ".txt", ".sh", ".html", ".js", ""}


@pytest.fixture
def clean_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CCRK_ variable from the machine running the tests; a fresh get_settings()."""
    import os

    for key in [k for k in os.environ if k.startswith("CCRK_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(REPO / "deploy")  # no .env file here
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_reference_doc_is_generated_from_the_settings() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert text == reference("markdown"), "stale: run `ccrk config reference --out deploy/CONFIGURATION.md`"
    rows = [line for line in text.splitlines() if line.startswith("| `CCRK_")]
    assert [row.split("`")[1] for row in rows] == env_names()
    assert len(rows) == len(Settings.model_fields)
    for name, field in Settings.model_fields.items():
        row = rows[list(Settings.model_fields).index(name)]
        assert (field.description or "").replace("|", "\\|") in row, name


def test_doc_shows_no_machine_paths() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert str(REPO) not in text
    assert "`model/pretrained/ccrk-demo` (embedded)" in text


def test_every_ccrk_variable_named_in_the_project_is_a_setting() -> None:
    files: list[Path] = [REPO / f for f in SCANNED_FILES if (REPO / f).is_file()]
    for folder in SCANNED_DIRS:
        files += [p for p in (REPO / folder).rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    assert len(files) > 50
    known = set(env_names())
    unknown = {
        (str(path.relative_to(REPO)), name)
        for path in files
        if "__pycache__" not in path.parts
        for name in NAME.findall(path.read_text(encoding="utf-8", errors="replace"))
        if name not in known
    }
    assert not unknown, sorted(unknown)


def test_config_reference_check_flags_a_stale_file(tmp_path: Path) -> None:
    out = tmp_path / "CONFIGURATION.md"
    runner = CliRunner()
    assert runner.invoke(app, ["config", "reference", "--out", str(out), "--check"]).exit_code == 1
    assert runner.invoke(app, ["config", "reference", "--out", str(out)]).exit_code == 0
    assert out.read_text(encoding="utf-8") == reference("markdown")
    result = runner.invoke(app, ["config", "reference", "--out", str(out), "--check"])
    assert result.exit_code == 0, result.output
    out.write_text(reference("markdown").replace("CCRK_PORT", "CCRK_PROT"), encoding="utf-8")
    assert runner.invoke(app, ["config", "reference", "--out", str(out), "--check"]).exit_code == 1


def test_env_template_lists_every_variable() -> None:
    template = reference("env")
    for name in env_names():
        assert re.search(rf"^# {name}=", template, re.M), name


@pytest.mark.usefixtures("clean_settings")
def test_config_show_prints_values_and_masks_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCRK_PORT", "9123")
    monkeypatch.setenv("CCRK_ADMIN_API_KEY", "s3cret-key")
    monkeypatch.setenv("CCRK_REDIS_URL", "redis://ops:hunter2@cache.internal:6380/2")
    monkeypatch.setenv("CCRK_CORS_ORIGINS", '["https://shop.example"]')
    result = CliRunner().invoke(app, ["config", "show"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "CCRK_PORT=9123" in lines
    assert "CCRK_ADMIN_API_KEY=****" in lines
    assert "CCRK_REDIS_URL=redis://ops:****@cache.internal:6380/2" in lines
    assert 'CCRK_CORS_ORIGINS=["https://shop.example"]' in lines
    assert "# CCRK_PROBE_SET is unset" in lines
    assert "s3cret" not in result.output and "hunter2" not in result.output
    assert len(lines) == len(env_names())


@pytest.mark.usefixtures("clean_settings")
def test_config_show_names_the_variable_that_does_not_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCRK_PORT", "eighty")
    result = CliRunner().invoke(app, ["config", "show"])
    assert result.exit_code == 2
    assert "CCRK_PORT" in result.output and "'eighty'" in result.output
