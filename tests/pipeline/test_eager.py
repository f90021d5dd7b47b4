"""Eager tasks (steersman._eager): a coroutine's first step at once, as a task (an attempt raced against its
deadline starts so: tests/reliability/test_runner.py)."""

import asyncio

import pytest

from steersman._eager import eager_task


async def test_the_first_step_runs_at_once_as_the_task():
    loop = asyncio.get_running_loop()
    seen = []
    fut = loop.create_future()

    async def handler():
        seen.append(("step", asyncio.current_task(loop)))
        v = await fut
        seen.append(("resumed", v, asyncio.current_task(loop)))
        return v * 2

    task, step = eager_task(loop, handler())
    assert seen == []  # made, not run: the caller keeps the task before any of it runs
    step()
    assert seen == [("step", task)]  # no loop turn: current_task() was the task during the step
    assert asyncio.current_task(loop) is asyncio.current_task()  # the test's own task is current again
    fut.set_result(21)
    assert await task == 42
    assert seen[1] == ("resumed", 21, task)


async def test_a_coroutine_that_ends_or_fails_in_its_step():
    loop = asyncio.get_running_loop()

    async def done():
        return "ok"

    async def bad():
        raise ValueError("boom")

    task, step = eager_task(loop, done())
    step()
    assert await task == "ok"
    task, step = eager_task(loop, bad())
    step()
    with pytest.raises(ValueError, match="boom"):
        await task


async def test_cancelled_while_waiting_reaches_the_coroutine():
    loop = asyncio.get_running_loop()
    cleaned = []

    async def handler():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cleaned.append(True)
            raise

    task, step = eager_task(loop, handler())
    step()
    task.cancel()  # before the task's first turn: thrown into the coroutine where its step stopped
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]

    task, step = eager_task(loop, handler())
    step()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()  # after it: plain delegation
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True, True]


async def test_the_coroutine_catching_a_cancel_goes_on():
    loop = asyncio.get_running_loop()

    async def handler():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0)
            return "cleaned up"

    task, step = eager_task(loop, handler())
    step()
    task.cancel()
    assert await task == "cleaned up"


async def test_started_from_inside_another_task():
    loop = asyncio.get_running_loop()
    seen = []

    async def inner():
        seen.append(asyncio.current_task(loop))
        await asyncio.sleep(0)
        return 1

    async def outer():
        task, step = eager_task(loop, inner())
        step()  # the outer task is set aside for the step, then current again
        seen.append(asyncio.current_task(loop))
        return task

    me = asyncio.create_task(outer())
    task = await me
    assert seen == [task, me]
    assert await task == 1


class _Marker:
    """Held by each handler's frame: found in the garbage only if that frame was left in a reference cycle."""


async def test_no_reference_cycles_on_any_path():
    # the wrapper's frames sat in the tracebacks of what it relayed: a cancel's traceback held the frame that held
    # the cancel (a cycle per client leaving mid-stream, found by tests/gateway/test_no_garbage.py)
    from asyncio import CancelledError

    from tests.gc_cycles import cyclic_garbage

    loop = asyncio.get_running_loop()

    async def fails():
        m = _Marker()  # noqa: F841
        raise ValueError("boom")

    async def waits():
        m = _Marker()  # noqa: F841
        await asyncio.sleep(30)

    cyclic_garbage(lambda o: False)  # what the test run left so far
    for make, cancel_after in ((fails, None), (waits, 0), (waits, 2)):
        task, step = eager_task(loop, make())
        step()
        if cancel_after is not None:
            for _ in range(cancel_after):
                await asyncio.sleep(0)
            task.cancel()
        try:
            await task
        except (ValueError, CancelledError):
            pass
        del task, step
    assert cyclic_garbage(lambda o: isinstance(o, _Marker)) == {}


# ---- found by review (thirty-second session); each failed before its fix ---------------------------------------------

async def test_a_cancel_before_the_first_turn_cancels_what_the_step_awaits():
    # Task.cancel() cancels the future the task waits on; the step's future was unknown to the task, so a child
    # task awaited there ran on to its end
    loop = asyncio.get_running_loop()
    ran = []

    async def child():
        await asyncio.sleep(0.05)
        ran.append("child finished")

    async def parent():
        await asyncio.ensure_future(child())

    task, step = eager_task(loop, parent())
    step()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.1)
    assert ran == []


async def test_a_cancel_before_the_first_turn_of_a_finished_step_ends_it_cancelled():
    loop = asyncio.get_running_loop()

    async def done():
        return 5

    task, step = eager_task(loop, done())
    step()
    assert task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_the_step_runs_once_and_not_once_cancelled():
    loop = asyncio.get_running_loop()
    runs = []

    async def body():
        runs.append(1)
        await asyncio.sleep(0)
        return len(runs)

    task, step = eager_task(loop, body())
    step()
    step()  # (a second call resumed the coroutine outside the task: "await wasn't used with future")
    assert await task == 1
    task, step = eager_task(loop, body())
    task.cancel()
    step()  # (ran the first step, side effects and all, of a task already cancelled)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert runs == [1]


async def test_keyboard_interrupt_in_the_step_goes_up_once():
    loop = asyncio.get_running_loop()

    async def interrupted():
        raise KeyboardInterrupt

    task, step = eager_task(loop, interrupted())
    with pytest.raises(KeyboardInterrupt):
        step()
    assert await task is None  # (raised it again from the task's first turn, out of asyncio.run's cleanup)
