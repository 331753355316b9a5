"""The documentation site: `mkdocs build --strict` passes (a broken link or anchor, or a page missing from
the navigation, fails it); the generated reference names every `ccrk` command and option, every setting and
every HTTP route, compared with the live objects; a new command appears with nothing edited; every recorded
benchmark result is listed with its command; and the built getting-started page renders in headless
Chromium (screenshot in $TMPDIR/ccrk-test-screenshots/)."""

from __future__ import annotations

import html
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import click
import pytest
import typer

from ccrk_settings import Settings
from ccrk_settings.reference import env_name
from docs.gen import reference as gen
from tests.artifacts_guard import screenshots_dir
from tests.deploy.deployment import make_dry_run
from tests.docs.runnable import REPO

TAG = re.compile(r"<[^>]+>")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    mkdocs = REPO / ".venv" / "bin" / "mkdocs"
    assert mkdocs.is_file(), f"{mkdocs} is missing: `make install` installs the docs extra (mkdocs-material)"
    proc = subprocess.run(
        [
            str(mkdocs),
            "build",
            "--strict",
            "-f",
            str(REPO / "mkdocs.yml"),
            "-d",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, (
        f"mkdocs build --strict failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    assert "WARNING" not in proc.stderr
    return out


def test_make_docs_builds_strictly_and_docs_serve_serves() -> None:
    mkdocs = str(Path(".venv") / "bin" / "mkdocs")
    assert make_dry_run("docs")[-1] == f"{mkdocs} build --strict"
    assert make_dry_run("docs-serve")[-1].startswith(f"{mkdocs} serve --dev-addr 127.0.0.1:")
    assert any("'.[dev,ray,docs]'" in line for line in make_dry_run("install")), (
        "make install installs mkdocs"
    )
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci.index(".venv/bin/mkdocs build --strict") > ci.index("make test")


def text_of(page: Path) -> str:
    """A built page's text, tags dropped and entities decoded."""
    return html.unescape(TAG.sub("", page.read_text(encoding="utf-8")))


def sections(markdown: str) -> dict[str, str]:
    """Heading text -> the text up to the next heading."""
    parts = re.split(r"^(#+ .*)$", markdown, flags=re.M)
    return {parts[i].lstrip("# ").strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_site_builds_strictly_with_every_section(site: Path) -> None:
    for page in (
        "index.html",
        "getting-started/index.html",
        "how-to/index-a-catalogue/index.html",
        "how-to/products-and-hybrid-search/index.html",
        "how-to/deploy-guide/index.html",
        "reference/cli/index.html",
        "reference/settings/index.html",
        "reference/http-api/index.html",
        "reference/openapi.json",
        "models/ccrk-demo/index.html",
        "explanations/mrv/index.html",
        "benchmarks/results/index.html",
    ):
        assert (site / page).is_file(), page
    assert (site / "assets" / "search-page.png").stat().st_size > 10_000
    assert not (site / "gen").exists(), "the generator scripts are not published"
    assert (site / "search" / "search_index.json").is_file(), "the search plugin ran"


def test_cli_reference_names_every_command_and_option(site: Path) -> None:
    markdown = gen.cli_markdown()
    by_heading = sections(markdown)
    built = text_of(site / "reference" / "cli" / "index.html")
    commands = gen.cli_commands()
    assert len(commands) > 25
    assert str(REPO) not in markdown, "no machine paths (defaults inside the checkout are shown relative)"
    for name, command in commands:
        section = by_heading[f"`{name}`"]
        assert name in built, name
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.opts[0] in section, f"{name} {param.opts[0]}"
                assert param.opts[0] in built
            elif isinstance(param, click.Argument):
                assert param.human_readable_name in section, f"{name} {param.human_readable_name}"


def test_a_new_command_appears_without_editing_the_docs() -> None:
    app = typer.Typer()

    @app.command("brand-new")
    def brand_new(shiny_option: int = typer.Option(3, help="An option no page names.")) -> None:
        """A command added after the docs were written."""

    @app.command("other")
    def other() -> None:
        """Another."""

    markdown = gen.cli_markdown(app)
    assert "brand-new" in markdown and "--shiny-option" in markdown and "An option no page names." in markdown


def test_settings_reference_names_every_setting(site: Path) -> None:
    markdown = gen.settings_markdown()
    built = text_of(site / "reference" / "settings" / "index.html")
    assert len(Settings.model_fields) > 50
    for name, field in Settings.model_fields.items():
        assert f"`{env_name(name)}`" in markdown, name
        assert env_name(name) in built, name
        assert (field.description or "").replace("|", "\\|") in markdown, name


def test_http_reference_names_every_route_and_schema(site: Path) -> None:
    schema = gen.openapi_schema()
    built = text_of(site / "reference" / "http-api" / "index.html")
    operations = gen.http_operations(schema)
    assert ("POST", "/v1/search") in operations and len(operations) > 10
    for method, path in operations:
        assert f"{method} {path}" in built, (method, path)
        op = schema["paths"][path][method.lower()]
        for param in op.get("parameters", []):
            assert param["name"] in built
    for name, component in schema["components"]["schemas"].items():
        assert name in built, name
        for field in component.get("properties", {}):
            assert field in built, f"{name}.{field}"
    assert (site / "reference" / "openapi.json").read_text(encoding="utf-8").count('"/v1/') >= 10


def test_index_format_lists_every_manifest_field(site: Path) -> None:
    import dataclasses

    from store.version.manifest import IndexManifest

    built = text_of(site / "reference" / "index-format" / "index.html")
    assert "<!-- generated" not in (site / "reference" / "index-format" / "index.html").read_text(
        encoding="utf-8"
    )
    for f in dataclasses.fields(IndexManifest):
        assert f.name in built, f.name


def test_every_recorded_result_is_listed_with_its_command(site: Path) -> None:
    built = text_of(site / "benchmarks" / "results" / "index.html")
    files = gen.result_files()
    assert len(files) > 10
    for path in files:
        assert gen.result_command(path), f"{path.name}: no command recorded in it nor in RESULT_COMMANDS"
        assert f"bench/results/{path.name}" in built


def test_model_cards_and_deploy_guide_come_from_their_files(site: Path) -> None:
    card = (REPO / "model" / "cards" / "ccrk-starter.md").read_text(encoding="utf-8")
    first_line = next(line for line in card.splitlines() if line.strip() and not line.startswith("#"))
    built = " ".join(text_of(site / "models" / "ccrk-starter" / "index.html").split())
    assert " ".join(re.sub(r"[`*_]", "", first_line).split())[:60] in built
    guide = text_of(site / "how-to" / "deploy-guide" / "index.html")
    assert "docker compose up --build" in guide and "deploy/k8s/" in guide


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def served_site(site: Path) -> Iterator[str]:
    """The built site over HTTP on a loopback port (material's pages load their assets by relative URL)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_getting_started_page_in_a_browser(served_site: str) -> None:
    from docs.gen.screenshot import NoBrowser, chromium, page

    try:
        browser = chromium()
        drv = browser.__enter__()
    except NoBrowser as exc:
        pytest.skip(f"{exc} (.ci/run installs them)")
    try:
        shot = page(drv, served_site + "/getting-started/", screenshots_dir() / "docs-getting-started.png")
        assert shot.stat().st_size > 20_000
        assert drv.title.startswith("Getting started")
        assert drv.find_element("css selector", "h1").text == "Getting started"
        nav = drv.find_element("css selector", "nav.md-nav--primary").get_attribute("textContent")
        for section in ("How-to guides", "Reference", "Explanations", "Benchmarks"):
            assert section in nav
        # Material's code copy buttons, one per code block, and its search box.
        assert len(drv.find_elements("css selector", "button.md-code__button, button.md-clipboard")) >= 8
        assert drv.find_elements("css selector", "input.md-search__input")
    finally:
        browser.__exit__(None, None, None)
