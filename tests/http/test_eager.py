"""Eager tasks (steersman.http._eager) and the server starting a request's handler inside the read that completed it.

A handler started with ``loop.create_task`` first ran one loop turn later, behind every callback already ready: under
load, the rest of the turn's reads and relays came before the gateway even looked at a new request (its queueing on
the gateway's core was most of the added time to first token at 64 streams).
"""

import asyncio

import pytest
import uvloop

from steersman.api.errors import error_body
from steersman.http._connection import _Connection
from steersman._eager import eager_task
from steersman.http.server import HttpServer


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


class _Transport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.out = []

    def write(self, data):
        self.out.append(bytes(data))

    def is_closing(self):
        return False

    def close(self):
        pass

    def get_extra_info(self, name, default=None):
        return default


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_request_is_handled_inside_the_read_that_completed_it(loop_kind):
    # failed before: the handler ran a loop turn after the read, behind everything already ready
    order = []

    async def main():
        loop = asyncio.get_running_loop()
        srv = HttpServer(error_body, 1000)

        async def handler(req):
            order.append("handler")
            req.respond(200, b"{}")

        srv.route("POST", "/x", handler)
        conn = _Connection(srv)
        t = _Transport()
        conn.connection_made(t)
        loop.call_soon(order.append, "ready before")  # e.g. another stream's relay, queued by this turn
        conn.data_received(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}")
        assert order == ["handler"]  # answered in the read, before the loop's turn goes on
        assert t.out and t.out[0].startswith(b"HTTP/1.1 200")
        await asyncio.sleep(0)
        assert order == ["handler", "ready before"]
        conn.connection_lost(None)

    if loop_kind == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


async def test_pipelined_requests_in_one_read_are_answered_in_order():
    srv = HttpServer(error_body, 1000)
    gate = asyncio.get_running_loop().create_future()

    async def first(req):
        await gate  # the second waits its turn behind it, even though it is already in
        req.respond(200, b"1")

    async def second(req):
        req.respond(200, b"2")

    srv.route("GET", "/1", first)
    srv.route("GET", "/2", second)
    conn = _Connection(srv)
    t = _Transport()
    conn.connection_made(t)
    conn.data_received(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
    assert t.out == []
    gate.set_result(None)
    for _ in range(5):
        await asyncio.sleep(0)
    assert [o.rsplit(b"\r\n\r\n", 1)[1] for o in t.out] == [b"1", b"2"]
    conn.connection_lost(None)


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
