"""The gateway's glue between the pure control plane and live requests.

The :class:`~steersman.control.plane.ControlPlane` decides; this mixin makes
its decisions happen on the event loop: it starts dispatches (replica
accounting, prefix-index learning), wakes queued requests when capacity frees
(after a request ends or a scrape arrives), expires queued requests whose
deadline became infeasible, and settles every request exactly once at the end
(tokens, spend, workflow state, the engine's reported cache hits).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from steersman.control.plane import Dispatch, Refuse
from steersman.pipeline.context import RequestContext

__all__ = ["RequestLifecycle"]

_EXPIRE_EVERY_S = 0.05  # queued deadlines are re-checked at the metrics scrape cadence


class RequestLifecycle:
    def __init__(self) -> None:
        self._kick_pending = False
        self._expiry: asyncio.Task | None = None
        self._out_est: dict[str, float] = {}

    # ---- dispatch -------------------------------------------------------------------
    def start_dispatch(self, ctx: RequestContext, d: Dispatch) -> None:
        """The request goes to ``d.route.replica``: account it there now (before the next decision)."""
        route = d.route
        i = route.replica
        req = ctx.sched
        fleet = self.fleet
        hashes = req.block_hashes
        held = int(fleet.prefix.match(hashes)[i]) if fleet.prefix is not None and hashes else 0
        uncached = req.prompt_tokens - min(held * self.block_size, max(req.prompt_tokens - 1, 0))
        blocks = math.ceil((req.prompt_tokens + req.expected_output) / self.block_size)
        ctx.admit = d.admit
        ctx.replica = i
        ctx.uncached_tokens = uncached
        ctx.predicted_hit_blocks = held
        ctx.ticket = fleet.begin(i, uncached, blocks, route.predicted_ttft_s, route.predicted_tpot_s)
        if fleet.prefix is not None and hashes:
            fleet.prefix.record(i, hashes)

    def notify(self, outcomes: list[tuple[Any, Dispatch | Refuse]]) -> None:
        for ctx, out in outcomes:
            w = ctx.waiter
            if w is not None and not w.done():
                if isinstance(out, Dispatch):
                    self.start_dispatch(ctx, out)
                w.set_result(out)

    def kick(self) -> None:
        """Capacity may have freed: dispatch queued requests soon (coalesced)."""
        if self._kick_pending or not self.plane.waiting:
            return
        self._kick_pending = True
        asyncio.get_running_loop().call_soon(self._dispatch)
        if self._expiry is None or self._expiry.done():
            self._expiry = asyncio.get_running_loop().create_task(self._expire_loop())

    def _dispatch(self) -> None:
        self._kick_pending = False
        now = self.clock.now()
        for ctx, d in self.plane.dispatch(self.fleet.snapshot, now):
            self.notify([(ctx, d)])

    async def _expire_loop(self) -> None:
        while self.plane.waiting:
            await self.clock.sleep(_EXPIRE_EVERY_S)
            self.notify(self.plane.expire(self.fleet.snapshot(), self.clock.now()))
            self._dispatch()

    def stop_lifecycle(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()

    # ---- the end of every request ---------------------------------------------------------
    def expected_output(self, model: str) -> int:
        return int(self._out_est.get(model, self.scheduler_settings.initial_output_estimate))

    def end_request(self, ctx: RequestContext) -> None:
        """Settle the request once: replica accounting, tokens and spend, workflow, prefix index."""
        t, ctx.ticket = ctx.ticket, None
        admit, ctx.admit = ctx.admit, None
        if t is None:
            return
        now = self.clock.now()
        fleet = self.fleet
        out = ctx.output_tokens
        fleet.end(t, out)
        # its share of the replica's GPU time: the whole request divided among the batch it joined
        cost = fleet.statics.price_per_hour[t.replica] / 3600.0 * (now - t.started) / t.batch
        req = ctx.sched
        if admit is not None:
            self.plane.finish(admit, req.prompt_tokens + out, cost, now)
        if req.workflow is not None:
            self.workflows.record(req.tenant, req.workflow.workflow_id, tokens=req.prompt_tokens + out, cost_usd=cost, now=now)
        if out and ctx.status == 200:
            old = self._out_est.get(req.model)
            a = self.scheduler_settings.latency_ewma_alpha
            self._out_est[req.model] = out if old is None else old + a * (out - old)
        if ctx.cached_tokens is not None:
            fleet.observe_prefix(t.replica, ctx.predicted_hit_blocks, ctx.cached_tokens // self.block_size)
        self.kick()
