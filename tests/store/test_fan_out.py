"""store.fan_out: steps run beside the caller give the same answers, raise in the caller, and run inline
when every thread is busy or the pool is closed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from store.fan_out import FanOut
from store.hybrid import HybridQuery, gather
from store.lexical import analyze
from tests.store.test_products import TEXTS, make_channels


def test_gather_with_a_fan_out_equals_gather_without(tmp_path: Path) -> None:
    channels, _, _, text_vecs, _ = make_channels(tmp_path, exact_max=2)  # graph walks, not exact search
    fan_out = FanOut(2)
    try:
        for i, (_, _, lang, text) in enumerate(TEXTS):
            q = HybridQuery(text_vecs[i], analyze(text, lang), "en")
            a, b = gather(channels, q, 10, None), gather(channels, q, 10, None, fan_out=fan_out)
            np.testing.assert_array_equal(a.rows, b.rows)
            np.testing.assert_array_equal(a.features, b.features)
            np.testing.assert_array_equal(a.ranks, b.ranks)
            assert [a.matched_terms(j) for j in range(len(a))] == [b.matched_terms(j) for j in range(len(b))]
    finally:
        fan_out.close()
        channels.close()


def test_a_step_runs_on_the_pool_raises_in_the_caller_and_runs_inline_when_busy() -> None:
    fan_out = FanOut(1)
    release = threading.Event()
    try:
        assert fan_out.start(lambda: threading.current_thread().name)().startswith("ccrk-fan-out")
        blocked = fan_out.start(release.wait, 5)  # the only thread busy
        here = threading.current_thread().name
        assert fan_out.start(lambda: threading.current_thread().name)() == here
        release.set()
        assert blocked() is True

        def fails() -> None:
            raise ValueError("step failed")

        with pytest.raises(ValueError, match="step failed"):
            fan_out.start(fails)()
    finally:
        fan_out.close()
    assert fan_out.start(lambda: threading.current_thread().name)() == threading.current_thread().name


def test_a_failing_caller_waits_for_its_steps_and_a_closed_pool_still_runs_queued_ones(
    tmp_path: Path,
) -> None:
    channels, _, _, text_vecs, _ = make_channels(tmp_path, exact_max=2)
    fan_out = FanOut(2)
    finished: list[str] = []

    def walk(*args: object) -> object:
        time.sleep(0.2)
        finished.append("photos")
        return real_walk(*args)

    real_walk = channels.photos.search
    channels.photos.search = walk  # type: ignore[method-assign]

    def broken(*args: object) -> None:
        raise RuntimeError("text walk failed")

    channels.texts.search = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="text walk failed"):
        gather(channels, HybridQuery(text_vecs[0], ["oat"], "en"), 10, None, fan_out=fan_out)
    assert finished == ["photos"]  # the query did not return before its photo walk ended
    release = threading.Event()
    first = fan_out.start(release.wait, 5)
    second = fan_out.start(lambda: "queued")
    fan_out.close()  # while a step runs: queued or running steps still finish
    release.set()
    assert first() is True and second() == "queued"
    channels.close()
