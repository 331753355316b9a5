"""One served index's files truncated in place under load (issue 44): that index answers 503 naming the
file, every other index and ``/healthz`` keep answering, and the process stays up; a new publish serves the
index again. Before ``store.guard`` the first search reading the truncated mapping killed the process with
SIGBUS, taking every index down with it."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from store.layout import index_dir
from tests.fixtures import Catalogue, write_version
from tests.service.conftest import REPO, ServeProcess

# A filter keeps the search exact over the mapped embeddings (``IndexVersion.search``): every search of the
# damaged index reads the truncated file.
BODY = {"top_k": 5, "filters": {"count": {"gte": 1}}}
ROUTES = {"shop": "/v1/search", "shopb": "/v1/indexes/shopb/search"}


class Load:
    """One client thread per index searching in a loop (distinct queries: no cached answer) until stopped,
    or for ``limit_s`` at most; each answer's status (or error name) and 503 message are recorded."""

    def __init__(self, served: ServeProcess, limit_s: float = 120.0) -> None:
        self.url = served.url
        self.served = served
        self.stop = threading.Event()
        self.deadline = time.monotonic() + limit_s
        self.statuses: dict[str, list[int | str]] = {name: [] for name in ROUTES}
        self.refusals: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(name,), daemon=True) for name in ROUTES]

    def _run(self, name: str) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            i = 0
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                try:
                    r = client.post(ROUTES[name], json={"query": f"a red striped mug {i}", **BODY})
                    status: int | str = r.status_code
                    if status == 503:
                        self.refusals.append(r.json()["detail"][0]["msg"])
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                    time.sleep(0.05)  # a dead server: no busy loop
                self.statuses[name].append(status)
                i += 1

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def until(self, what: str, check: object, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():  # type: ignore[operator]
            code = self.served.proc.poll() if self.served.proc is not None else None
            # -7: SIGBUS, what a read of a truncated mapping did before ``store.guard``.
            assert code is None, f"{what}: the server died (exit code {code}; {self.summary()})"
            assert time.monotonic() < deadline, f"{what}: not seen in {timeout:.0f} s ({self.summary()})"
            time.sleep(0.05)

    def summary(self) -> dict[str, Counter[int | str]]:
        return {name: Counter(seen) for name, seen in self.statuses.items()}


def test_one_index_truncated_in_place_under_load_answers_503_and_harms_nothing_else(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    root = tmp_path / "indexes"
    write_version(root, catalogue, name="shop")
    damaged = index_dir(root, "shopb") / write_version(root, catalogue, name="shopb")
    env = {
        "CCRK_INDEX_POLL_S": "0.2",
        "CCRK_RERANK": "false",
        "CCRK_HISTORY_DB": str(tmp_path / "history.sqlite"),
        "PYTHONPATH": str(REPO),  # this checkout's code, whatever the environment's editable install names
    }
    arrays = sorted(damaged.glob("*.npy"))
    assert arrays, "the version maps no array"
    with ServeProcess("--index-root", str(root), "--index-name", "shop,shopb", env=env) as served:
        with Load(served) as load:
            load.until("both answering", lambda: all(s.count(200) >= 5 for s in load.statuses.values()))
            before = {name: len(seen) for name, seen in load.statuses.items()}

            # In place, as through another version's hard link: a lease holds it until the version is closed.
            def truncate() -> None:
                for path in arrays:
                    os.truncate(path, 128)

            truncation = threading.Thread(target=truncate, daemon=True)
            truncation.start()
            load.until("the damaged index refused", lambda: 503 in load.statuses["shopb"])
            truncation.join(timeout=60)
            assert not truncation.is_alive(), "the truncation was held for good"
            assert all(path.stat().st_size == 128 for path in arrays)
            after = len(load.statuses["shop"])
            load.until("the other index answering on", lambda: len(load.statuses["shop"]) >= after + 20)
            assert served.proc is not None and served.proc.poll() is None
            health = httpx.get(served.url + "/healthz", timeout=10)
            assert health.status_code == 200 and health.json()["pid"] == served.pid
        seen = load.summary()
        # The other index answered every request, during and after the damage.
        assert set(seen["shop"]) == {200}, seen
        # The damaged one answered until the damage, then refused with the file named, and never failed else.
        damaged_answers = load.statuses["shopb"]
        assert set(damaged_answers) <= {200, 503}, seen
        first = damaged_answers.index(503)
        assert first >= before["shopb"] - 1 and set(damaged_answers[first:]) == {503}, seen
        # Held by a lease: "being truncated ... in place"; without one: "... bytes ...: changed in place".
        named = [any(msg.startswith(f"no index loaded: {p.name} ") for p in arrays) for msg in load.refusals]
        assert load.refusals and all(named), load.refusals[:3]
        assert all(" in place" in msg for msg in load.refusals), load.refusals[:3]
        ready = httpx.get(served.url + "/readyz", timeout=10).json()
        assert ready["status"] == "ready" and ready["indexes"]["shopb"] is None, ready
        assert "shopb: " in ready["detail"] and " in place" in ready["detail"], ready

        # A sound version published serves the index again.
        fresh = write_version(root, catalogue, name="shopb")
        with httpx.Client(base_url=served.url, timeout=30) as client:
            deadline = time.monotonic() + 30
            while True:
                r = client.post(ROUTES["shopb"], json={"query": "a red striped mug", **BODY})
                if r.status_code == 200:
                    break
                assert r.status_code == 503 and time.monotonic() < deadline, r.text
                time.sleep(0.1)
            assert r.json()["index_version"] == fresh
        assert served.proc.poll() is None
