"""Runs the ordered stages of the request path under the one outcome contract, retrying only where safe.

Stages run in order until one responds or fails.  From the ``schedule`` stage on,
the runner loops (when it has a :class:`Retrier`):

* ``Fail(err, Retry.SAFE)`` from ``forward`` (nothing reached the client): if the
  attempt count (``retry_max_attempts``), the request's deadline, the retry budget
  (Envoy's: retries <= 20 % of active requests, min 3; a protected workflow step
  buys a larger share; a retry away from a replica its failure just took out of
  rotation needs no token; a token is held until the retried attempt's first
  token — from then on the retry has worked and its load is the request's own) allow, the failed replica joins ``ctx.excluded``, the runner
  sleeps a full-jitter backoff on the injected clock, re-runs ``schedule`` (which
  routes again without re-admitting, avoiding ``ctx.excluded``) and forwards again.
* ``Fail(err, Retry.CONTINUE_ONLY)`` (bytes have streamed): if
  ``ctx.continuation.allowed`` and the deadline allows, the same, without backoff
  or budget (this is the same request going on, not more load): ``forward`` sees
  ``ctx.continuation`` and resumes the stream on the new replica.
* Otherwise the failure is answered (:func:`send_error` ends a started stream
  with an error event).

Every upstream attempt first passes the gateway's client-side adaptive throttle
(Google SRE); each attempt's verdict on its replica (served / server-side
failure) goes to the fleet (:meth:`Fleet.report`), which feeds outlier
ejection, the circuit breaker and the concurrency limiter.

Deadlines: ``forward`` is raced against the request's deadline
(``x-steersman-deadline-ms``); at the deadline the upstream exchange is
cancelled (the engine sees the connection drop and aborts) and the client gets
504, or an error event ending its stream.  When a replica is ejected, its
attempts that have not sent the client anything are abandoned (their engine
connection dropped) and retried elsewhere (:meth:`Pipeline.evict`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from steersman._eager import eager_task
from steersman.api.errors import ApiError, sse_error_event, upstream_failed
from steersman.obs.histogram import CounterFamily
from steersman.pipeline.context import RequestContext
from steersman.pipeline.outcome import Continue, Fail, Outcome, Respond, Retry
from steersman.reliability.retrier import Retrier

__all__ = ["Stage", "Pipeline", "Retrier", "send_error"]  # Retrier: re-exported from steersman.reliability.retrier

log = logging.getLogger("steersman.reliability")


@runtime_checkable
class Stage(Protocol):
    name: str

    async def run(self, ctx: RequestContext) -> Outcome: ...


def send_error(ctx: RequestContext, err: ApiError) -> None:
    """Answer with ``err``; if a stream already reached the client, end it with an error event instead.  A stream
    whose head is still held (its engine failed before the first event) is taken back: the client gets the error's
    own status (a 502 it may retry), not a 200 stream holding an error event."""
    req = ctx.http
    if req.started and req.withdraw():
        ctx.status = 0  # the 200 the stream had set never went out
    ctx.status = ctx.status or err.status
    if not req.started:
        req.respond(err.status, err.body(), extra=err.header_lines())
    else:
        ctx.failed = True  # (served: no; its status is the 200 the stream began with)
        req.send(sse_error_event(err))
        req.end_stream()


def _deadline_error() -> ApiError:
    return ApiError(504, "The request's deadline (x-steersman-deadline-ms) passed before the engine finished.",
                    "server_error", None, "deadline_exceeded")


def _throttled_error(settings) -> ApiError:
    """The throttle's refusal; ``Retry-After`` is one bucket of its window (``settings``: the reliability settings):
    the soonest its oldest counts leave the window and its rejection probability falls with no new success."""
    return ApiError(503, "The gateway is throttling requests: the engines are failing too many of them.",
                    "server_error", None, "throttled", settings.throttle_window_s / settings.throttle_buckets)


class Pipeline:
    def __init__(self, stages: Sequence[Stage], retrier: Retrier | None = None, fleet=None) -> None:
        self.stages = tuple(stages)
        self.retrier = retrier
        self.fleet = fleet  # steersman.fleet.state.Fleet: attempt verdicts (None: not reported)
        names = [s.name for s in self.stages]
        self._loop_at = names.index("schedule") if "schedule" in names and names[-1] == "forward" else None
        self._active: dict[int, set[RequestContext]] = {}  # replica -> attempts in progress there
        self._evicted: set[RequestContext] = set()  # attempts abandoned because their replica was ejected
        self._tasks: dict[RequestContext, asyncio.Task] = {}  # attempt -> the task running it (for eviction)
        self._cancelling: set[RequestContext] = set()  # attempts cancelled by an eviction (not by the client)
        self._stuck: dict[RequestContext, float] = {}  # attempts cancelled as stuck -> their replica's quiet seconds
        self._loop: asyncio.AbstractEventLoop | None = None

    async def handle(self, ctx: RequestContext) -> None:
        stages = self.stages
        head = stages if self._loop_at is None or self.retrier is None else stages[: self._loop_at]
        for stage in head:
            out = await stage.run(ctx)
            if isinstance(out, Continue):
                continue
            if isinstance(out, Respond):
                return
            if isinstance(out, Fail):
                send_error(ctx, out.error)
                return
        if head is stages:
            raise RuntimeError("the request path ended without a response")  # a wiring bug, not a request error
        out = await self._route_and_forward(ctx, stages[self._loop_at : -1], stages[-1])
        if isinstance(out, Fail):
            send_error(ctx, out.error)

    # ---- the retry loop ---------------------------------------------------------------------
    async def _route_and_forward(self, ctx: RequestContext, route: Sequence[Stage], forward: Stage) -> Outcome:
        r = self.retrier
        assert r is not None
        r.begin()
        holding = [False]  # a retry-budget token: held from a retry decision to its attempt's first token
        last: Fail | None = None  # the last upstream failure: what the client sees if no retry succeeds
        reschedules = 0
        try:
            while True:
                out = await self._route(ctx, route)
                if isinstance(out, Fail):
                    if last is None or out.retry is not Retry.SAFE:
                        return last or out
                    # a retry's route stage found no replica free right now: wait (bounded) and route again (the
                    # gateway's Schedule stage itself waits in the gateway queue then: ControlPlane.requeue)
                    reschedules += 1
                    if reschedules >= r.s.retry_max_attempts or not await self._backoff(ctx, reschedules):
                        return last
                    continue
                if not isinstance(out, Continue):
                    return out
                if not r.admit_attempt(ctx.bytes_sent):
                    return last or Fail(_throttled_error(r.s), Retry.NEVER)
                ticket = ctx.ticket
                ctx.attempts += 1
                if holding[0] and ticket is not None:
                    ticket.on_first = lambda: self._release(holding)
                out = await self._attempt(ctx, forward)
                if isinstance(out, Respond):
                    r.attempt_ended(True)
                    self._verdict(ticket, True)
                    return out
                if not isinstance(out, Fail) or out.retry is Retry.NEVER:
                    # (a deadline that passed, an engine's refusal: no verdict on the engines for the throttle,
                    # which counted 20 tight-deadline 504s as a failing fleet and refused healthy requests)
                    return out
                if out.retry is Retry.SAFE and ctx.bytes_sent:
                    # cancelled by an eviction or the stall rule after checking that nothing was sent, the relay's
                    # callback wrote the engine's first bytes in that loop turn: only a continuation is left
                    out = Fail(out.error, Retry.CONTINUE_ONLY)
                r.attempt_ended(False)
                evicted = ctx in self._evicted
                self._evicted.discard(ctx)
                if not evicted:  # the gateway's own abandoning of an ejected replica's attempts is no verdict on it
                    self._verdict(ticket, False)
                last = out
                if ctx.replica is not None:
                    ctx.excluded.add(ctx.replica)
                cont = ctx.continuation
                continue_only = out.retry is Retry.CONTINUE_ONLY
                # a retry away from a replica that is now out of rotation (a failed connect marked it unhealthy,
                # ejected, breaker open) or that the gateway abandoned re-routes that replica's share: no token
                # (asked only when it matters)
                replica = ctx.replica
                d = r.after_failure(continue_only, ctx.attempts, cont is not None and cont.allowed, r.remaining(ctx.sched),
                                    lambda: evicted or (self.fleet is not None and replica is not None
                                                        and self.fleet.out_of_rotation(replica)),
                                    evicted, holding[0], r.share(ctx.sched))
                holding[0] = d.holding
                if not d.again:
                    return out
                if not continue_only:
                    await r.clock.sleep(d.delay_s)
        finally:
            self._evicted.discard(ctx)
            held, holding[0] = holding[0], False  # a late first-token hook must not give the token back twice
            r.end(held)

    async def _route(self, ctx: RequestContext, route: Sequence[Stage]) -> Outcome:
        for stage in route:
            out = await stage.run(ctx)
            if not isinstance(out, Continue):
                return out
        return out

    async def _backoff(self, ctx: RequestContext, attempt: int) -> bool:
        """Sleep a full-jitter backoff unless it would end past the deadline; False: no time left."""
        r = self.retrier
        delay = r.backoff(attempt, r.remaining(ctx.sched))
        if delay is None:
            return False
        await r.clock.sleep(delay)
        return True

    def _release(self, holding: list[bool]) -> None:
        if holding[0]:
            holding[0] = False
            self.retrier.release()

    def _verdict(self, ticket, ok: bool) -> None:
        if self.fleet is not None and ticket is not None:
            self.fleet.report(ticket, ok)

    # ---- one upstream attempt: deadline and eviction ----------------------------------------------
    async def _attempt(self, ctx: RequestContext, forward: Stage) -> Outcome:
        i = ctx.replica
        active = self._active.setdefault(i, set()) if i is not None else None
        if active is not None:
            active.add(ctx)
            # not a local of this frame: a cancellation's traceback holds the frame, the task holds the
            # cancellation, and a local naming the task would close a reference cycle per cancelled request
            self._tasks[ctx] = self._current_task()
        try:
            left = self.retrier.remaining(ctx.sched)
            if left is None:
                return await forward.run(ctx)
            if left <= 0:
                return Fail(_deadline_error(), Retry.NEVER)
            return await self._before_deadline(ctx, forward, left)
        except asyncio.CancelledError:
            if ctx not in self._cancelling:
                raise
            self._cancelling.discard(ctx)
            quiet = self._stuck.pop(ctx, None)
            if self._tasks[ctx].uncancel() > 0:
                raise  # cancelled for another reason too (the client left)
            name = self.fleet.replicas[i].name if self.fleet is not None else str(i)
            if quiet is not None:  # a verdict on the replica (not an eviction): retried elsewhere, 504 at the end
                return Fail(ApiError(504, f"Engine {name} showed no progress for {quiet:.3g} s while this request "
                                     "waited for its answer.", "server_error", None, "upstream_timeout"), Retry.SAFE)
            return Fail(upstream_failed(f"Engine {name} was taken out of rotation before it answered", 502), Retry.SAFE)
        finally:
            if active is not None:
                active.discard(ctx)
                self._tasks.pop(ctx, None)
                self._cancelling.discard(ctx)
                self._stuck.pop(ctx, None)

    def _current_task(self) -> asyncio.Task:
        # asyncio.current_task() without a loop costs a getpid syscall on CPython 3.11: pass the loop
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        if task is None:
            self._loop = asyncio.get_running_loop()
            task = asyncio.current_task(self._loop)
        assert task is not None
        return task

    async def _before_deadline(self, ctx: RequestContext, forward: Stage, left: float) -> Outcome:
        # the attempt's first step (to its engine write) runs now, inside this request's step, not a loop turn
        # later behind the other requests' steps (``steersman._eager``)
        task, step = eager_task(self._loop or asyncio.get_running_loop(), forward.run(ctx))
        step()
        timer = asyncio.ensure_future(self.retrier.clock.sleep(left))
        try:
            await asyncio.wait((task, timer), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            timer.cancel()
            if task.done() and not task.cancelled() and ctx in self._cancelling:
                # evicted in the loop turn the attempt ended in (its answer may be written): the answer stands
                self._cancelling.discard(ctx)
                self._evicted.discard(ctx)
                if self._tasks[ctx].uncancel() == 0:
                    return task.result()
            task.cancel()
            raise
        if task.done():
            timer.cancel()
            return task.result()
        task.cancel()  # forward drops the engine connection: the engine aborts the request
        try:
            await task
        except asyncio.CancelledError:
            pass
        self.retrier.counts.inc("deadline_exceeded")
        return Fail(_deadline_error(), Retry.NEVER)

    def watch(self, guard, names: Sequence[str]) -> None:
        """Follow a :class:`~steersman.reliability.ReplicaGuard`: log and count ejections, evict their attempts."""
        ejections = CounterFamily("steersman:replica_ejections", "Replicas taken out of rotation by outlier detection.",
                                  ["replica"])
        self.retrier.families.append(ejections)

        def ejected(i: int, reason: str) -> None:
            ejections.inc(names[i])
            n, m = self.evict(i)
            log.warning("replica %s ejected (%s); %d waiting attempt(s) moved, %d stream(s) continued elsewhere",
                        names[i], reason, n, m)

        guard.on_eject = ejected
        guard.on_sweep = self.sweep_streams

    def sweep_streams(self, now: float) -> int:
        """Streams under way with no event for ``stream_idle_timeout_s`` (a frozen engine that nothing
        ejected) have their engine connection dropped: they continue on another replica, or end with an
        error event when they cannot; returns how many."""
        idle = self.retrier.s.stream_idle_timeout_s
        n = 0
        for replica, attempts in self._active.items():
            for ctx in attempts:
                if not ctx.bytes_sent:
                    n += self._stuck_attempt(ctx, replica, now, idle)
                    continue
                last = ctx.last_event_at
                if not ctx.bytes_sent or last is None or now - last < idle or ctx.http.client_paused:
                    continue  # (paused: the client cannot keep up and the gateway stopped reading the engine)
                if self._drop_engine(ctx):
                    ctx.last_event_at = None  # once
                    self.retrier.counts.inc("stream_idle")
                    name = self.fleet.replicas[replica].name if self.fleet is not None else replica
                    log.warning("stream on replica %s idle for %.3gs: engine connection dropped", name, now - last)
                    n += 1
        return n

    def _stuck_attempt(self, ctx: RequestContext, replica: int, now: float, idle: float) -> bool:
        """An attempt awaiting its first byte (or its whole answer) on a replica that has shown no progress since
        it was sent (no stream event there, no advance of its engine's work counter; a whole answer only where the
        engine has one) for ``stream_idle_timeout_s``
        and 3x (``latency_outlier_ratio``) what it was predicted to take: cancelled, a failure of the replica,
        retried elsewhere (504 ``upstream_timeout`` when no retry is left).  The stall rule ejects an outlier within
        seconds, but never the whole fleet: frozen all at once, with no deadline asked, every request waited for
        its client's timeout (reliability audit: 150 s, no byte).  True if it was cancelled now."""
        fleet, t = self.fleet, ctx.ticket
        if fleet is None or t is None or t.replica != replica or ctx in self._cancelling or ctx not in self._tasks:
            return False
        if not t.streamed and not fleet.counts_work()[replica]:
            return False  # a whole answer computed where no work counter shows progress: its silence says nothing
        quiet = now - max(t.started, float(fleet.output_at[replica]))
        if quiet < max(idle, self.retrier.s.latency_outlier_ratio * fleet.expected_of(t)):
            return False
        self._stuck[ctx] = quiet
        self._cancelling.add(ctx)
        self._tasks[ctx].cancel()
        self.retrier.counts.inc("attempt_idle")
        log.warning("replica %s showed no progress for %.3gs while a request waited there: attempt cancelled",
                    fleet.replicas[replica].name, quiet)
        return True

    def evict(self, replica: int) -> tuple[int, int]:
        """The replica was ejected: move its attempts elsewhere; returns (retried, continued).

        An attempt that sent the client nothing is cancelled (its upstream request is
        aborted on the way out, whether its response had started or not) and
        :meth:`_attempt` turns the cancel into a ``Retry.SAFE`` failure: it is retried
        elsewhere.  A stream under way whose continuation is allowed has its engine
        connection dropped and continues token-exactly on another replica (a hung
        engine's streams would otherwise stall until the client gives up); one that
        cannot continue is left to finish there.
        """
        n = m = 0
        for ctx in list(self._active.get(replica, ())):
            if not ctx.bytes_sent:
                if ctx not in self._cancelling:
                    self._evicted.add(ctx)
                    self._cancelling.add(ctx)
                    self._tasks[ctx].cancel()
                n += 1
            elif ctx.continuation is not None and ctx.continuation.allowed and self._drop_engine(ctx):
                m += 1
        return n, m

    @staticmethod
    def _drop_engine(ctx: RequestContext) -> bool:
        """Close the engine connection of a streaming attempt: its relay fails with ``Retry.CONTINUE_ONLY``."""
        producer = getattr(ctx.http, "producer", None)
        if producer is None or not hasattr(producer, "abort"):
            return False
        producer.abort()
        return True
