"""Screenshots in headless Chromium (Debian's chromium and chromedriver, driven by selenium; nothing
downloaded): the README's picture of the search page, from a real running service, and the docs test's
picture of the built site.

    make demo    # in another terminal: the demo service on http://127.0.0.1:8000
    python docs/gen/screenshot.py --url http://127.0.0.1:8000 --out docs/assets/search-page.png
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)
# The README's search: a French query the demo catalogue answers (three yellow umbrellas).
QUERY = "trois parapluies jaunes"
IMAGES_LOADED = """const imgs = Array.from(document.querySelectorAll('.panel .card img'));
return imgs.length > 0 && imgs.every(i => i.complete && i.naturalWidth > 0) ? imgs.length : 0;"""


class NoBrowser(RuntimeError):
    """Debian's chromium or chromedriver is not installed."""


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A headless Chromium session (selenium WebDriver), quit on exit."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        raise NoBrowser(
            "Debian chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (*CHROMIUM_FLAGS, f"--window-size={width},{height}"):
        options.add_argument(flag)
    drv = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    drv.set_page_load_timeout(60)
    try:
        yield drv
    finally:
        drv.quit()


def wait_js(drv: Any, script: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = drv.execute_script(script)
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for: {script}")
        time.sleep(0.1)


def warm_up(base_url: str) -> None:
    """One re-ranked search of another query first: the first search after a start pays the encoders'
    warm-up, which the screenshot's timings should not show."""
    import json
    import urllib.request

    request = urllib.request.Request(
        base_url.rstrip("/") + "/v1/search",
        data=json.dumps({"query": "two red mugs", "top_k": 24}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def search_page(drv: Any, base_url: str, out: Path, query: str = QUERY) -> Path:
    """The search page of a running service after a search (a shared link: it searches on load)."""
    warm_up(base_url)
    drv.get(base_url.rstrip("/") + "/?" + urlencode({"q": query}))
    wait_js(drv, "return document.getElementById('results').dataset.done")
    wait_js(drv, IMAGES_LOADED)
    out.parent.mkdir(parents=True, exist_ok=True)
    drv.save_screenshot(str(out))
    return out


def page(drv: Any, url: str, out: Path) -> Path:
    """Any page, once loaded (and its fonts), full height up to 4,000 px."""
    drv.get(url)
    wait_js(drv, "return document.readyState === 'complete' && document.fonts.status === 'loaded'")
    height = int(drv.execute_script("return document.documentElement.scrollHeight"))
    drv.set_window_size(1280, min(max(height, 900), 4000))
    out.parent.mkdir(parents=True, exist_ok=True)
    drv.save_screenshot(str(out))
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Screenshot the search page of a running service.")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="The service's base URL.")
    parser.add_argument("--out", type=Path, default=Path("docs/assets/search-page.png"))
    parser.add_argument("--query", default=QUERY)
    args = parser.parse_args(argv)
    with chromium() as drv:
        print(search_page(drv, args.url, args.out, args.query))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
