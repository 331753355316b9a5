"""The README: at most 200 lines, the two quickstart commands as they always were, links that resolve, and
its catalogue-in-5-minutes blocks run as a reader runs them in a fresh clone (the starter model built, a
manifest written, indexed, served and queried), answering as the README says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.runnable import REPO, Sandbox, json_values, runnable_blocks

README = REPO / "README.md"
QUICKSTART = """```bash
make demo   # set up, draw a 1,000-product demo catalogue, index it, serve it on http://127.0.0.1:8000
make test   # set up and run the test suite
```"""
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_short_and_keeps_the_quickstart() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    assert QUICKSTART in text


def test_readme_links_resolve() -> None:
    targets = [t for t in LINK.findall(README.read_text(encoding="utf-8")) if not t.startswith("http")]
    assert len(targets) > 20
    missing = [t for t in targets if not (REPO / t.split("#")[0]).exists()]
    assert not missing, missing


def test_readme_catalogue_in_5_minutes_runs(tmp_path: Path) -> None:
    blocks = runnable_blocks(README)
    assert [b.background for b in blocks].count(True) == 1
    sandbox = Sandbox(tmp_path)
    if (why := sandbox.install_is_done()) is not None:
        pytest.skip(why)
    ran = sandbox.run_page(blocks)
    assert (tmp_path / "artifacts" / "models" / "ccrk-starter" / "config.json").is_file()
    umbrellas, lamps = json_values(ran[-1].stdout)
    # "in any language": the German word for umbrella finds an umbrella first.
    assert umbrellas["language"]["code"] == "de"
    assert umbrellas["results"][0]["id"].startswith("umbrella-")
    # "with filters on your fields": every hit within the price and the categories asked for.
    assert lamps["results"][0]["id"] == "lamp-brown"
    for hit in lamps["results"]:
        assert hit["metadata"]["price"] <= 40 and hit["metadata"]["category"] in ("lighting", "kitchen")
        assert hit["match"] in ("strong", "weak", "none") and hit["image_url"]
