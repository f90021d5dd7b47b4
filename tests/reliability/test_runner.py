"""The runner's retry loop with stand-in stages: safe retries, budget, continuation, deadline, throttle."""

import asyncio
import random
from dataclasses import replace

from steersman.api.errors import ApiError
from steersman.config import DEFAULTS
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


def _run(script, n=3, settings=DEFAULTS.reliability, ctx=None, clock=None):
    clock = clock or FakeClock()
    fwd = _Forward(script)
    sched = _Schedule(n)
    p = Pipeline([sched, fwd], Retrier(settings, clock, random.Random(0)))
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
    p = Pipeline([_Schedule(3), _Forward(["ok"])], Retrier(DEFAULTS.reliability, clock, random.Random(0)))
    for _ in range(1000):
        p.retrier.throttle.result(0.0, False)  # 1000 attempts, none served
    ctx = _ctx()
    asyncio.run(p.handle(ctx))
    assert ctx.http.answer[0] == 503 and b"throttled" in ctx.http.answer[1] and b"Retry-After" in ctx.http.answer[2]
