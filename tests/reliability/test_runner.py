"""The runner's retry loop with stand-in stages: safe retries, budget, continuation, deadline, throttle."""

import asyncio
import random
from dataclasses import replace

import pytest

from steersman.api.errors import ApiError
from steersman.config import DEFAULTS
from steersman.fleet.state import Fleet, Replica
from steersman.pipeline.context import RequestContext
from steersman.pipeline.outcome import CONTINUE, RESPONDED, Fail, Retry
from steersman.pipeline.runner import Pipeline, Retrier
from steersman.policy.request import LatencyBudget
from steersman.testing import FakeClock
from steersman.testing.snapshots import sched_request


class _Http:
    def __init__(self):
        self.started = False
        self.answer = None
        self.producer = None

    def respond(self, status, body, content_type=b"", extra=b""):
        self.started = True
        self.answer = (status, body, extra)

    def send(self, data):
        self.answer = ("event", data)

    def end_stream(self):
        pass

    def withdraw(self):
        return False


class _Schedule:
    name = "schedule"

    def __init__(self, n):
        self.n = n
        self.calls = []

    async def run(self, ctx):
        free = [i for i in range(self.n) if i not in ctx.excluded]
        self.calls.append(set(ctx.excluded))
        if not free:
            return Fail(ApiError(503, "none", "server_error"), Retry.NEVER)
        ctx.replica = free[0]
        return CONTINUE


class _Forward:
    name = "forward"

    def __init__(self, script):
        self.script = list(script)  # per attempt: "ok", "safe", "cont", "hang"

    async def run(self, ctx):
        what = self.script.pop(0)
        if what == "ok":
            return RESPONDED
        if what == "hang":
            await asyncio.Event().wait()
        return Fail(ApiError(502, f"engine {ctx.replica} failed", "server_error"),
                    Retry.SAFE if what == "safe" else Retry.CONTINUE_ONLY)


class _Cont:
    allowed = True


def _ctx(budget=LatencyBudget()):
    ctx = RequestContext(http=_Http(), kind="chat", path="/v1/chat/completions", seq=1, started=0.0)
    ctx.sched = replace(sched_request(1), budget=budget)
    return ctx


class _RefusingForward(_Forward):
    """As the real forward stage on a refused connection: the replica is marked unhealthy, the failure is safe."""

    def __init__(self, script, fleet):
        super().__init__(script)
        self.fleet = fleet

    async def run(self, ctx):
        if self.script[0] == "refused":
            self.script.pop(0)
            self.fleet.set_healthy(ctx.replica, False)
            return Fail(ApiError(502, f"cannot connect to engine {ctx.replica}", "server_error"), Retry.SAFE)
        return await super().run(ctx)


def _run(script, n=3, settings=DEFAULTS.reliability, ctx=None, clock=None, fleet=None):
    clock = clock or FakeClock()
    fwd = _Forward(script) if fleet is None else _RefusingForward(script, fleet)
    sched = _Schedule(n)
    p = Pipeline([sched, fwd], Retrier(settings, clock, random.Random(0)), fleet)
    for _ in range(100):  # a history of served attempts: the adaptive throttle lets everything through
        p.retrier.throttle.result(0.0, True)
    ctx = ctx or _ctx()

    async def go():
        task = asyncio.ensure_future(p.handle(ctx))
        while not task.done():
            await clock.advance(0.5)
            await asyncio.sleep(0)
        return task.result()

    asyncio.run(go())
    return ctx, sched, p


def test_safe_failures_retry_on_other_replicas_then_succeed():
    ctx, sched, p = _run(["safe", "safe", "ok"])
    assert ctx.http.answer is None and ctx.attempts == 3  # RESPONDED: the forward stage answered
    assert sched.calls == [set(), {0}, {0, 1}]
    assert p.retrier.counts.get("retried") == 2 and p.retrier.budget.retries == 0 and p.retrier.budget.active == 0


def test_attempts_are_capped_and_the_last_upstream_error_is_answered():
    ctx, _, _ = _run(["safe"] * 5, n=6)
    assert ctx.attempts == DEFAULTS.reliability.retry_max_attempts
    assert ctx.http.answer[0] == 502 and b"engine 2 failed" in ctx.http.answer[1]


def test_no_other_replica_answers_the_upstream_error():
    ctx, sched, _ = _run(["safe", "safe"], n=2)
    assert ctx.http.answer[0] == 502 and b"engine 1 failed" in ctx.http.answer[1]


def test_an_exhausted_budget_stops_retries():
    s = replace(DEFAULTS.reliability, retry_min_concurrency=0)  # 20 % of one active request < 1
    ctx, _, p = _run(["safe", "ok"], settings=s)
    assert ctx.attempts == 1 and ctx.http.answer[0] == 502 and p.retrier.counts.get("budget_exhausted") == 1


def test_a_retry_away_from_a_replica_its_failure_took_out_of_rotation_needs_no_budget():
    # a refused connection marks the replica unhealthy: the retry re-routes that replica's share, as one away from
    # an ejected replica does, so it is not refused for want of a token (the chaos soak of 2026-12-01 lost requests
    # this way: several in flight to a replica that stopped listening, 3 tokens for them all)
    s = replace(DEFAULTS.reliability, retry_min_concurrency=0)  # no token for a lone request
    clock = FakeClock()
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "openai", "H100", ("m",), "p", 1.0, 1, None) for i in range(3)]
    fleet = Fleet(reps, clock)
    ctx, sched, p = _run(["refused", "ok"], settings=s, clock=clock, fleet=fleet)
    assert ctx.attempts == 2 and ctx.http.answer is None and sched.calls == [set(), {0}]
    assert p.retrier.counts.get("rerouted") == 1 and p.retrier.counts.get("budget_exhausted") == 0
    assert p.retrier.budget.retries == 0
    # a failure that leaves its replica in rotation still needs a token
    fleet = Fleet(reps, clock)
    ctx, _, p = _run(["safe", "ok"], settings=s, clock=clock, fleet=fleet)
    assert ctx.attempts == 1 and ctx.http.answer[0] == 502 and p.retrier.counts.get("budget_exhausted") == 1


def test_continuation_only_when_allowed():
    ctx = _ctx()
    ctx.continuation = _Cont()
    ctx, sched, p = _run(["cont", "ok"], ctx=ctx)
    assert ctx.attempts == 2 and p.retrier.counts.get("continued") == 1 and ctx.http.answer is None
    ctx = _ctx()
    ctx.continuation = _Cont()
    ctx.continuation.allowed = False
    ctx, _, _ = _run(["cont", "ok"], ctx=ctx)
    assert ctx.attempts == 1 and ctx.http.answer[0] == 502


def test_the_deadline_cancels_the_attempt_with_504():
    clock = FakeClock()
    ctx = _ctx(LatencyBudget(deadline=3.0))
    ctx, _, p = _run(["hang"], ctx=ctx, clock=clock)
    assert ctx.http.answer[0] == 504 and b"deadline" in ctx.http.answer[1]
    assert 3.0 <= clock.now() <= 4.0 and p.retrier.counts.get("deadline_exceeded") == 1


def test_the_adaptive_throttle_rejects_attempts_locally_when_the_engines_fail():
    clock = FakeClock()
    # (a draw under 0.8, the most it refuses: the first of Random(1) is 0.13)
    p = Pipeline([_Schedule(3), _Forward(["ok"])], Retrier(DEFAULTS.reliability, clock, random.Random(1)))
    for _ in range(1000):
        p.retrier.throttle.result(0.0, False)  # 1000 attempts, none served
    ctx = _ctx()
    asyncio.run(p.handle(ctx))
    assert ctx.http.answer[0] == 503 and b"throttled" in ctx.http.answer[1]
    # one of the throttle's buckets (30 s / 12): the soonest its refusals can ease without a success
    assert b"Retry-After: 3\r\n" in ctx.http.answer[2]


def test_a_stream_under_way_is_continued_even_while_the_throttle_refuses_new_work():
    # (review, twenty-seventh session) the throttle refused the continuation leg: the client's stream was cut
    clock = FakeClock()
    retrier = Retrier(DEFAULTS.reliability, clock, random.Random(0))

    class _BreaksMidStream(_Forward):
        async def run(self, ctx):
            if self.script[0] == "cont":  # its first tokens reached the client; meanwhile the engines fail a lot
                ctx.bytes_sent = True
                for _ in range(1000):
                    retrier.throttle.result(clock.now(), False)
            return await super().run(ctx)

    p = Pipeline([_Schedule(3), _BreaksMidStream(["cont", "ok"])], retrier)
    for _ in range(100):
        retrier.throttle.result(0.0, True)
    ctx = _ctx()
    ctx.continuation = _Cont()

    async def go():
        task = asyncio.ensure_future(p.handle(ctx))
        while not task.done():
            await clock.advance(0.5)
            await asyncio.sleep(0)

    asyncio.run(go())
    assert ctx.attempts == 2 and ctx.http.answer is None  # continued on replica 1 (no error event, no 503)


async def test_an_attempt_with_a_deadline_starts_at_once():
    # failed before: the attempt ran in a task of its own (to race the deadline's timer) whose first step, up to
    # the engine request's write, came a loop turn later, behind every callback already ready
    order = []

    class _Marking(_Forward):
        async def run(self, ctx):
            order.append("forward")
            return await super().run(ctx)

    clock = FakeClock()
    p = Pipeline([_Schedule(3), _Marking(["ok"])], Retrier(DEFAULTS.reliability, clock, random.Random(0)))
    ctx = _ctx(LatencyBudget(deadline=30.0))
    asyncio.get_running_loop().call_soon(order.append, "ready before")
    await p.handle(ctx)
    assert order[0] == "forward"


async def test_a_client_leaving_before_the_attempts_first_turn_cancels_it():
    # the eager attempt's first turn comes after the client's cancel: the cancel still reaches where it waits
    cancelled = []

    class _Waits(_Forward):
        async def run(self, ctx):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(ctx.replica)
                raise

    p = Pipeline([_Schedule(3), _Waits([])], Retrier(DEFAULTS.reliability, FakeClock(), random.Random(0)))
    outer = asyncio.ensure_future(p.handle(_ctx(LatencyBudget(deadline=30.0))))
    await asyncio.sleep(0)  # the handler's step: the attempt started, its task's first turn still queued
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    await asyncio.sleep(0)
    assert cancelled == [0]
