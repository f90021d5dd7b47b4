"""The gateway's glue between the pure control plane and live requests.

The :class:`~steersman.control.plane.ControlPlane` decides; this mixin makes
its decisions happen on the event loop: it starts dispatches (replica
accounting, prefix-index learning), wakes queued requests when capacity frees
(after a request ends, a prefill completes: its first token, or a scrape arrives), expires queued requests whose
deadline became infeasible, and settles every request exactly once at the end
(tokens, spend, workflow state, the engine's reported cache hits).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from steersman.control.plane import DISPATCH_BURST, Dispatch, Refuse
from steersman.pipeline.context import RequestContext

if TYPE_CHECKING:
    from steersman.control.accounting import Started

__all__ = ["RequestLifecycle"]


class RequestLifecycle:
    """Async glue for :class:`~steersman.control.accounting.Accounting` (set as ``self.accounting``; the
    gateway's metrics as ``self.metrics``)."""

    def __init__(self) -> None:
        self._kick_pending = False
        self._expiry: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def running_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop serving requests (kept: CPython 3.11's lookup costs a getpid syscall per call)."""
        loop = self._loop
        if loop is None or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    # ---- dispatch -------------------------------------------------------------------
    def start_dispatch(self, ctx: RequestContext, d: Dispatch, earlier: Started | None = None) -> None:
        """The request goes to ``d.route.replica``: account it there now (before the next decision).  Its
        prompt's blocks reach the prefix index once its bytes are written to the engine (the forward stage
        flushes the index then), or at the next decision if that comes first.  ``earlier``: a retry's failed
        attempt (:meth:`Accounting.left`), whose cost the request carries."""
        started = self.accounting.dispatched(ctx.sched, d, defer_record=True, earlier=earlier)
        self.metrics.routed(ctx.model, d.route.slo_prediction)  # type: ignore[attr-defined]
        ctx.started_at = started
        ctx.replica = started.replica
        ctx.ticket = started.ticket

    def notify(self, outcomes: list[tuple[Any, Dispatch | Refuse]]) -> None:
        for ctx, out in outcomes:
            w = ctx.waiter
            if w is not None and not w.done():
                if isinstance(out, Dispatch):  # a retry that waited again carries its failed attempt (Schedule)
                    self.start_dispatch(ctx, out, ctx.started_at)
                w.set_result(out)
            elif isinstance(out, Dispatch) and ctx.started_at is None:
                # its client left in the loop turn that dispatched it (its task is cancelled, it no longer waits and
                # abandon() finds nothing queued): the admission goes back here (a retry's is settled at its end)
                self.plane.admitter.release(out.admit, self.clock.now())

    def kick(self) -> None:
        """Capacity may have freed: dispatch queued requests soon (coalesced)."""
        if self._kick_pending or not self.plane.waiting:
            return
        self._kick_pending = True
        loop = self.running_loop()
        loop.call_soon(self._dispatch)
        if self._expiry is None or self._expiry.done():
            self._expiry = loop.create_task(self._expire_loop())

    def _dispatch(self) -> None:
        self._kick_pending = False
        now = self.clock.now()
        for _ in range(DISPATCH_BURST):  # one at a time: each dispatch's accounting must be in the next decision's snapshot
            out = self.plane.dispatch(self.fleet.snapshot, now, limit=1)
            if not out:
                break
            self.notify(out)

    async def _expire_loop(self) -> None:
        while self.plane.waiting:
            await self.clock.sleep(self.settings.metrics_interval_s)  # queued deadlines: at the scrape cadence
            self.notify(self.plane.expire(self.fleet.snapshot(), self.clock.now()))
            self._dispatch()

    def stop_lifecycle(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()

    # ---- the end of every request ---------------------------------------------------------
    def expected_output(self, model: str, tenant: str | None = None, max_tokens: int | None = None) -> int:
        return self.accounting.expected_output(model, tenant, max_tokens)

    def end_request(self, ctx: RequestContext) -> None:
        """Settle the request once (see :meth:`Accounting.ended`), then let queued requests in."""
        started, ctx.started_at = ctx.started_at, None
        ctx.ticket = None
        if started is None:
            return
        if ctx.status == 400 and getattr(ctx.http, "held", None) is not None:
            # a Responses try refused for its context's length, sent again shorter: not the client's call
            self.accounting.withdrawn(started)
            self.kick()
            return
        cont = ctx.continuation  # a continued stream: its last replica made only the tokens since its leg began
        leg = ctx.output_tokens - cont.leg_start if cont is not None and cont.legs > 1 else None
        self.accounting.ended(started, ctx.output_tokens, ctx.status == 200 and not ctx.failed, ctx.cached_tokens, leg)
        self.kick()
