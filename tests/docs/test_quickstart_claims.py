"""What a new user read in the README and getting-started page and found untrue (issue 44, 9): the curls
hard-code port 8000 while the port to change it, ``DEMO_PORT``, was named only in the Makefile; the times
given held only on an idle machine (``build-starter`` 54 s against "5–10 s", ``make demo`` 426 s against
96 s on a loaded 2-core machine). The pages name the port where the curls are, and give ranges with the
load they were measured under."""

from __future__ import annotations

import re

from tests.docs.runnable import REPO

README = REPO / "README.md"
GETTING_STARTED = REPO / "docs" / "getting-started.md"
RANGE = r"(\d+)[–-](\d+) s"


def _makefile_port() -> str:
    (port,) = re.findall(r"^DEMO_PORT \?= (\d+)$", (REPO / "Makefile").read_text(encoding="utf-8"), re.M)
    return port


def test_the_port_is_named_before_the_first_curl() -> None:
    port = _makefile_port()
    for page in (README, GETTING_STARTED):
        text = page.read_text(encoding="utf-8")
        first_curl = text.index(f"curl -s localhost:{port}")
        assert "DEMO_PORT" in text[:first_curl], f"{page.name}: DEMO_PORT is not named before its curls"


def test_the_starter_build_time_is_a_range_with_its_load() -> None:
    text = README.read_text(encoding="utf-8")
    (sentence,) = [s for s in re.split(r"(?<=\.)\s", text) if "build it once" in s]
    ranges = [(int(a), int(b)) for a, b in re.findall(RANGE, sentence)]
    assert ranges and max(b for _, b in ranges) >= 54, sentence  # the loaded machine's 54 s is covered
    assert "load" in sentence, sentence


def test_the_measured_quickstart_states_a_loaded_machine() -> None:
    text = GETTING_STARTED.read_text(encoding="utf-8")
    section = text[text.index("## Measured quickstart") :]
    (demo_row,) = [line for line in section.splitlines() if line.startswith("| `make demo` on a fresh clone")]
    seconds = [int(n) for n in re.findall(r"(\d+) s\b", demo_row)]
    assert seconds and max(seconds) >= 426, demo_row  # the loaded run of the report
    assert "load" in demo_row, demo_row
    assert re.search(r"load average \d", section), "the load the figures were measured under"
