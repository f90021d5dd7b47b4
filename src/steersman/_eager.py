"""Eager tasks: a coroutine's first step runs at once, not one event-loop turn later.

``loop.create_task`` schedules a coroutine's first step behind every callback already ready.  Where a task is
started from inside another task's step, with light work ahead (an attempt raced against its deadline, in
``pipeline/runner.py``: its first step is the engine request's write), that turn is pure delay on the request's
way to the engine, and :func:`eager_task` removes it.  Not for the HTTP server's handlers (measured, 2026-12-07):
started in the read that completed the request, a request's ~300 us of admission and routing ran ahead of the
other streams' relays of that read batch (first tokens among them), where ``create_task`` leaves it after them,
light work first; at 64 streams the gateway's CPU per request and the clients' TTFT p50 both went up (6.1 ->
7.5-11 ms in one harness).

CPython 3.12 can start tasks eagerly itself (``asyncio.eager_task_factory``); :func:`eager_task` does it on 3.11
too, and hands the caller the task before the step (which 3.12's does not): the task is made first
(``asyncio.current_task()`` is that task during the step, as the request path needs), the step runs in the
task's context, and the task continues the coroutine from where the step stopped.
"""

from __future__ import annotations

import asyncio
import contextvars
from asyncio.tasks import _enter_task, _leave_task, current_task
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["eager_task"]

_PENDING = object()  # nothing left from the step: the task's turns are the coroutine's
_DONE = object()  # the coroutine ended in its first step
_FAILED = object()  # it raised in its first step


class _Continued(Coroutine):
    """What the task runs: the coroutine from where its eager step stopped.  Its first turn takes up what the step
    left (the future to wait on, the result, the exception); a cancel before that turn is thrown into the coroutine
    where it stopped (a coroutine wrapping it would have taken the cancel unstarted, leaving it suspended forever);
    every later turn is the coroutine's own."""

    __slots__ = ("coro", "first", "result", "error", "started")

    def __init__(self, coro: Coroutine) -> None:
        self.coro = coro
        self.first: Any = _PENDING
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = False  # the coroutine has run (the step, or a turn of the task's own)

    def send(self, value: Any) -> Any:
        self.started = True
        first = self.first
        if first is _PENDING:
            return self.coro.send(value)
        self.first = _PENDING
        if first is _DONE:
            raise StopIteration(self.result)
        if first is _FAILED:
            self._raise()
        return first  # the future the step stopped at (or None: a bare yield, as asyncio.sleep(0) makes)

    def __next__(self) -> Any:
        return self.send(None)

    def throw(self, typ, val=None, tb=None):  # type: ignore[override]
        self.started = True
        first, self.first = self.first, _PENDING
        cancel = isinstance(typ, asyncio.CancelledError) or typ is asyncio.CancelledError
        if first is _DONE:
            if cancel:  # cancelled before its first turn: cancel() said True, so the task ends cancelled
                self.result = None
                raise typ
            raise StopIteration(self.result)
        if first is _FAILED:
            self._raise()
        if cancel and isinstance(first, asyncio.Future):  # Task.cancel() cancels what the task waits on: the
            first.cancel()  # step left it unknown to the task (a child task awaited there is cancelled with it)
        try:
            if val is None and tb is None:
                return self.coro.throw(typ)
            return self.coro.throw(typ, val, tb)
        finally:  # what the coroutine raises holds this frame: not the exception thrown (a cycle per cancelled request)
            typ = val = tb = None

    def _raise(self) -> None:
        error, self.error = self.error, None
        try:
            raise error  # type: ignore[misc]
        finally:
            error = None  # (the frame in its traceback would hold it: a cycle)

    def close(self) -> None:
        self.coro.close()

    def __await__(self):
        return self


def eager_task(loop: asyncio.AbstractEventLoop, coro: Coroutine) -> tuple[asyncio.Task, Callable[[], None]]:
    """(the task, its first step): the caller keeps the task, then calls the step, which may finish the coroutine.

    The task exists before the step (``asyncio.current_task()`` is it during the step; a caller that must know the
    task before any of the coroutine runs has it) and its first scheduled turn only takes up what the step left:
    waiting on the future it stopped at, or the result or exception it ended with.  The step runs once, and not
    for a task already cancelled (its first turn then throws the cancel into the coroutine unstarted)."""
    rest = _Continued(coro)
    ctx = contextvars.copy_context()
    task = loop.create_task(rest, context=ctx)

    def step() -> None:
        if rest.started or task.done() or task.cancelling():
            return  # stepped already (or the loop starts tasks eagerly itself), or cancelled: the task's own turn
        outer = current_task(loop)  # started from inside another task's step (the runner's request task): that
        if outer is not None:       # one is set aside for the step, as 3.12 does
            _leave_task(loop, outer)
        _enter_task(loop, task)
        rest.started = True
        try:
            rest.first = ctx.run(coro.send, None)
        except StopIteration as stop:
            rest.first, rest.result = _DONE, stop.value
        except (KeyboardInterrupt, SystemExit):  # it goes on up from here, once (the task then ends, with None)
            rest.first = _DONE
            raise
        except BaseException as e:  # noqa: BLE001 - raised from the task, as a task's first step would
            # without this frame in its traceback: it holds the task (which will hold the exception), a cycle
            rest.first, rest.error = _FAILED, e.with_traceback(e.__traceback__.tb_next if e.__traceback__ else None)
        finally:
            _leave_task(loop, task)
            if outer is not None:
                _enter_task(loop, outer)

    return task, step
