"""A queued request whose client leaves in the loop turn that dispatches it gives its admission back.

The real Schedule stage, the gateway's request lifecycle (kick, dispatch, notify, end_request) and the real control
plane; the snapshot, the clock and the fleet's accounting are stand-ins (found by review, twenty-seventh session:
the admission leaked, and a tenant at its rate limit was refused for a minute).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from steersman.api.lifecycle import RequestLifecycle
from steersman.config import DEFAULTS
from steersman.config.admission import AdmissionSettings
from steersman.control import DefaultAdmitter, GatewayQueue, TenantConfig
from steersman.control.plane import ControlPlane, Dispatch
from steersman.pipeline.admit import Schedule
from steersman.pipeline.context import RequestContext
from steersman.policy import make_policy
from steersman.policy.request import PriorityClass
from steersman.testing import FakeClock
from steersman.testing.snapshots import fleet_snapshot, sched_request

DEPTH = DEFAULTS.scheduler.saturation_queue_depth
FREE = fleet_snapshot(2)
FULL = fleet_snapshot(2, waiting=[DEPTH + 1, DEPTH + 1])  # saturated: more than the depth waits


@dataclass
class _Started:
    admit: object


class _Accounting:
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    def dispatched(self, req, d, defer_record=False, earlier=None):
        return _Started(d.admit)

    def ended(self, started, out, ok, cached=None, leg=None):
        self.plane.finish(started.admit, 0, 0.0, 0.0)


class _Fleet:
    snap = FULL

    def snapshot(self):
        return self.snap


class _Gateway(RequestLifecycle):
    def __init__(self) -> None:
        super().__init__()
        s = AdmissionSettings()
        self.plane = ControlPlane(make_policy("steersman"), DefaultAdmitter(s), GatewayQueue(s))
        self.clock, self.fleet = FakeClock(), _Fleet()
        self.metrics = type("M", (), {"routed": lambda *a: None})()
        self.accounting = _Accounting(self.plane)


async def _leave_as_dispatched(race: bool) -> tuple[_Gateway, TenantConfig]:
    tenant = TenantConfig("t", PriorityClass.STANDARD, requests_per_minute=1)
    gw = _Gateway()
    ctx = RequestContext(http=None, kind="chat", path="/v1/chat/completions", seq=1, started=0.0, tenant=tenant,
                         sched=sched_request(seq=1))

    async def handle():
        try:
            await Schedule(gw).run(ctx)
        finally:
            gw.end_request(ctx)

    task = asyncio.ensure_future(handle())
    for _ in range(5):
        await asyncio.sleep(0)
    assert gw.plane.waiting == 1 and ctx.waiter is not None
    gw.fleet.snap = FREE  # capacity frees ...
    loop = asyncio.get_running_loop()
    loop.call_soon(task.cancel)  # ... the client's connection_lost comes first in this loop turn ...
    if race:
        loop.call_soon(gw._dispatch)  # ... and a kick from another request's end right after it
    with pytest.raises(asyncio.CancelledError):
        await task
    gw.stop_lifecycle()
    return gw, tenant


@pytest.mark.parametrize("race", [False, True])
async def test_a_client_leaving_as_its_request_is_dispatched_gives_the_admission_back(race):
    gw, tenant = await _leave_as_dispatched(race)
    assert gw.plane.waiting == 0
    out, _ = gw.plane.arrive("next", sched_request(seq=2), tenant, FREE, 0.0)
    assert isinstance(out, Dispatch)  # the tenant's one request a minute is free again
