"""The fair share of search slots (``service.caller_slots.CallerQueues``): each freed slot goes to the
waiting caller holding the fewest, one slot stays in reserve while another caller asks, a lone caller gets
every slot, the per-caller cap, and a wait that times out or is cancelled leaves nothing held; the default
number of slots."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from ccrk_settings import Settings
from service.caller_slots import CallerQueues, QueueTimeout


class Searches:
    """Searches that enter the queue and hold their slot until told to end, recording the order they
    started in."""

    def __init__(self, queues: CallerQueues) -> None:
        self.queues = queues
        self.started: list[str] = []
        self.ends: dict[int, anyio.Event] = {}
        self.running: list[int] = []

    async def search(self, n: int, identity: str) -> None:
        self.ends[n] = anyio.Event()
        async with self.queues.hold(identity):
            self.started.append(f"{identity}{n}")
            self.running.append(n)
            await self.ends[n].wait()
            self.running.remove(n)

    async def end_oldest(self) -> None:
        self.ends[self.running[0]].set()
        await anyio.sleep(0.01)


def test_a_freed_slot_goes_to_the_caller_holding_the_fewest() -> None:
    queues = CallerQueues(slots=2)
    s = Searches(queues)

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            for n in range(6):  # greedy: 2 run, 4 wait
                tg.start_soon(s.search, n, "g")
                await anyio.sleep(0.001)
            await anyio.sleep(0.01)
            assert s.started == ["g0", "g1"] and queues.waiting() == 4
            tg.start_soon(s.search, 10, "p")  # polite arrives last
            tg.start_soon(s.search, 11, "q")  # and a third caller after it
            await anyio.sleep(0.01)
            await s.end_oldest()  # p holds none, g two: p goes before g's four older searches
            assert s.started[-1] == "p10"
            await s.end_oldest()  # g1 ends: g and q hold none, p one; g's next waited longest
            assert s.started[-1] == "g2"
            await s.end_oldest()  # p10 ends: q holds none, g one
            assert s.started[-1] == "q11"
            await s.end_oldest()  # g2 ends: g holds none, q one
            assert s.started[-1] == "g3"
            while s.running:
                await s.end_oldest()
        assert sorted(s.started) == sorted(["g0", "g1", "g2", "g3", "g4", "g5", "p10", "q11"])

    anyio.run(run)
    assert queues.waiting() == 0 and queues.held("g") == 0 and queues._free == 2


def test_one_slot_stays_in_reserve_while_another_caller_asks() -> None:
    now = [0.0]
    queues = CallerQueues(slots=2, recent_s=1.0, clock=lambda: now[0])
    s = Searches(queues)

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.search, 0, "p")  # the polite caller asks once, and ends
            await anyio.sleep(0.01)
            await s.end_oldest()
            for n in range(1, 5):  # greedy: one runs, one slot stays free for p, three wait
                tg.start_soon(s.search, n, "g")
                await anyio.sleep(0.001)
            await anyio.sleep(0.01)
            assert queues.held("g") == 1 and queues._free == 1 and queues.waiting() == 3
            tg.start_soon(s.search, 10, "p")  # p's next search starts at once, on the reserved slot
            await anyio.sleep(0.01)
            assert s.started[-1] == "p10" and queues.waiting() == 3
            await s.end_oldest()  # g1 ends: g's next takes its slot, p holds the other
            assert s.started[-1] == "g2" and queues.held("g") == 1
            await s.end_oldest()  # p10 ends; p asked within the second: the slot stays in reserve
            assert queues.held("g") == 1 and queues._free == 1
            now[0] = 1.5  # p quiet for longer than recent_s: g alone gets every slot again
            await s.end_oldest()  # g2 ends
            assert queues.held("g") == 2 and queues.waiting() == 0
            while s.running:
                await s.end_oldest()

    anyio.run(run)
    assert queues.waiting() == 0 and queues._free == 2


def test_a_lone_caller_gets_every_slot_and_the_cap_holds_one_back() -> None:
    async def run(queues: CallerQueues, s: Searches, cap: int, want: int) -> None:
        async with anyio.create_task_group() as tg:
            for n in range(5):
                tg.start_soon(s.search, n, "shop")
            await anyio.sleep(0.02)
            assert len(s.running) == queues.held("shop") == want
            # Another caller starts at once where the cap left a slot free, and waits where not.
            tg.start_soon(s.search, 9, "other")
            await anyio.sleep(0.02)
            assert ("other9" in s.started) == (cap == 2)
            while s.running:
                await s.end_oldest()

    for cap, want in ((0, 3), (2, 2)):
        queues = CallerQueues(slots=3, per_caller=cap)
        anyio.run(run, queues, Searches(queues), cap, want)
        assert queues.waiting() == 0 and queues._free == 3


def test_a_wait_that_times_out_or_is_cancelled_holds_nothing() -> None:
    queues = CallerQueues(slots=1, wait_s=0.05)
    s = Searches(queues)

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.search, 0, "g")
            await anyio.sleep(0.01)
            with pytest.raises(QueueTimeout):
                async with queues.hold("p"):
                    pytest.fail("it had no slot")
            assert queues.waiting() == 0
            with anyio.move_on_after(0.01):  # a client that went away while waiting
                async with queues.hold("p"):
                    pytest.fail("it had no slot")
            assert queues.waiting() == 0
            await s.end_oldest()
        async with queues.hold("p"):  # the slot is free again
            assert queues.held("p") == 1

    anyio.run(run)
    assert queues.waiting() == 0 and queues.held("g") == queues.held("p") == 0 and queues._free == 1


def test_the_default_slots_are_the_cores_the_process_may_use_at_most_four(tmp_path: Path) -> None:
    original = os.sched_getaffinity(0)
    cores = len(original)
    assert Settings(index_root=tmp_path).search_slots() == max(1, min(4, cores))
    assert Settings(index_root=tmp_path, search_workers=7).search_slots() == 7
    assert Settings(index_root=tmp_path, workers=2).search_slots() == max(1, min(4, cores // 2))
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # this test's process on one core
    try:
        assert Settings(index_root=tmp_path).search_slots() == 1
    finally:
        os.sched_setaffinity(0, original)
