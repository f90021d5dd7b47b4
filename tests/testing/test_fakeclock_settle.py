"""FakeClock.advance lets every woken task run to its next sleep before time moves on, and refuses odd amounts."""

import asyncio
import math

import pytest

from steersman.testing import FakeClock


async def _probe() -> int:
    return 1


@pytest.mark.parametrize("between", [
    lambda: asyncio.gather(_probe(), _probe()),
    lambda: asyncio.wait_for(_probe(), 5),
    lambda: _hops(5),
], ids=["gather", "wait_for", "five-hops"])
async def test_a_periodic_task_awaiting_work_between_sleeps_ticks_at_every_deadline(between):
    clock, ticks = FakeClock(), []

    async def poller():
        while True:
            await clock.sleep(1.0)
            ticks.append(clock.now())
            await between()

    task = asyncio.create_task(poller())
    try:
        await clock.advance(5.0)
        assert ticks == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert clock.next_deadline() == 6.0
    finally:
        task.cancel()


async def _hops(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_task_started_just_before_advance_sleeps_from_the_start_of_the_window():
    clock, ticks = FakeClock(), []

    async def poller():
        while True:
            await clock.sleep(1.0)
            ticks.append(clock.now())

    task = asyncio.create_task(poller())  # not yet run: advance lets it register its first sleep at 0
    try:
        await clock.advance(2.0)
        assert ticks == [1.0, 2.0]
    finally:
        task.cancel()


async def test_a_task_that_never_sleeps_does_not_hang_advance():
    clock = FakeClock()

    async def spin():
        while True:
            await asyncio.sleep(0)

    task = asyncio.create_task(spin())
    try:
        await asyncio.wait_for(clock.advance(1.0), 10)
        assert clock.now() == 1.0
    finally:
        task.cancel()


@pytest.mark.parametrize("seconds", [-5.0, math.nan, math.inf])
async def test_advance_refuses_negative_nan_and_infinite_amounts(seconds):
    clock, woke = FakeClock(start=10.0), []

    async def sleeper():
        await clock.sleep(1.0)
        woke.append(clock.now())

    task = asyncio.create_task(sleeper())
    await asyncio.sleep(0)
    with pytest.raises(ValueError):
        await clock.advance(seconds)
    assert clock.now() == 10.0 and woke == []
    task.cancel()


async def test_sleep_refuses_nan():
    clock = FakeClock()
    task = asyncio.create_task(clock.sleep(math.nan))
    await asyncio.sleep(0)
    assert task.done() and isinstance(task.exception(), ValueError)  # not a NaN deadline in the heap
    assert clock.pending == 0 and clock.next_deadline() is None


def test_set_moves_time_for_synchronous_code_but_never_back_nor_past_a_sleeper():
    # FakeClock.set: synchronous tests (a fleet, a guard) moved time by writing the private ``_now``
    clock = FakeClock(5.0)
    clock.set(5.0)
    clock.set(7.5)
    assert clock.now() == 7.5 and clock.wall() == FakeClock(5.0).wall() + 2.5  # (the wall clock moves along)
    for bad in (7.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="forward"):
            clock.set(bad)

    async def main():
        sleeper = asyncio.ensure_future(clock.sleep(1.0))  # due at 8.5
        await asyncio.sleep(0)
        clock.set(8.0)  # before it: fine
        with pytest.raises(ValueError, match="advance"):
            clock.set(9.0)  # would skip it
        await clock.advance(1.0)
        assert sleeper.done() and clock.now() == 9.0

    asyncio.run(main())
