"""A retried request's failed attempt: it stops counting on the replica that failed it as soon as the request
leaves there (also while it waits in the gateway queue), and its replica time stays in the request's cost (the
tenant's spend, its workflow's sunk cost): issue #4, "retries and failed work count as cost"."""

from __future__ import annotations

import asyncio

import pytest

from steersman.config import DEFAULTS
from steersman.config.admission import AdmissionSettings
from steersman.control import DefaultAdmitter, GatewayQueue, TenantConfig
from steersman.control.accounting import Accounting
from steersman.control.plane import ControlPlane, Dispatch
from steersman.control.workflow import WorkflowHeaders, WorkflowTracker
from steersman.engines.openai_http import OpenAIHttpAdapter
from steersman.fleet import snapshot as S
from steersman.fleet.state import Fleet, Replica
from steersman.policy import make_policy
from steersman.policy.base import Route
from steersman.policy.request import PriorityClass, SchedRequest
from steersman.testing.clock import FakeClock

PRICE = 3.6  # $/h: $0.001 a second of the whole replica


def _setup():
    clock = FakeClock(start=100.0)
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9200 + i}", "vllm", None, ("m",), "p", PRICE, 1,
                    adapter=OpenAIHttpAdapter("vllm")) for i in range(2)]
    fleet = Fleet(reps, clock)
    s = AdmissionSettings()
    plane = ControlPlane(make_policy("steersman"), DefaultAdmitter(s), GatewayQueue(s))
    flows = WorkflowTracker()
    acc = Accounting(fleet, plane, flows, DEFAULTS.scheduler, DEFAULTS.engine.block_size)
    tenant = TenantConfig("t", PriorityClass.STANDARD)
    req = SchedRequest(seq=1, model="m", kind="chat", stream=True, tenant="t", priority=PriorityClass.STANDARD,
                       arrival=100.0, prompt_tokens=64, block_hashes=(), max_tokens=16, expected_output=16,
                       workflow=flows.track("t", WorkflowHeaders("job", 2, 5), 100.0))
    admit = plane.admitter.admit(req, tenant, 100.0)
    return clock, fleet, acc, plane, flows, req, admit


def _go(acc, req, admit, replica, earlier=None):
    return acc.dispatched(req, Dispatch(Route(replica, "test"), admit), earlier=earlier)


def _advance(clock, s):
    asyncio.run(clock.advance(s))


def test_a_retried_request_costs_its_failed_attempt_too():
    clock, fleet, acc, plane, flows, req, admit = _setup()
    first = _go(acc, req, admit, 0)
    assert fleet.live[S.IN_FLIGHT, 0] == 1
    _advance(clock, 2.0)  # the engine fails it after 2 s alone there: $0.002
    gone = acc.left(first)
    assert gone.ticket is None and fleet.live[S.IN_FLIGHT, 0] == 0
    assert gone.earlier_cost == pytest.approx(0.002)
    second = _go(acc, req, admit, 1, earlier=gone)
    _advance(clock, 1.0)
    cost = acc.ended(second, 16, True)
    assert cost == pytest.approx(0.003)  # 2 s on replica 0 and 1 s on replica 1; the failed work was dropped before
    assert plane.admitter.ledger.spent("t") == pytest.approx(0.003)
    assert flows.track("t", WorkflowHeaders("job", 3, 5), clock.now()).spent_usd == pytest.approx(0.003)
    assert fleet.live[S.IN_FLIGHT].tolist() == [0, 0]


def test_a_retry_waiting_in_the_queue_is_not_in_flight_on_the_replica_that_failed_it_and_is_settled_once():
    clock, fleet, acc, plane, flows, req, admit = _setup()
    first = _go(acc, req, admit, 0)
    _advance(clock, 1.5)
    waiting = acc.left(first)  # no replica can take the retry now: it waits in the gateway queue
    assert fleet.live[S.IN_FLIGHT].tolist() == [0, 0] and acc.left(waiting) is waiting
    _advance(clock, 5.0)  # refused from the queue (its deadline, say): the request ends, costing its failed attempt
    assert acc.ended(waiting, 0, False) == pytest.approx(0.0015)
    assert plane.admitter.ledger.spent("t") == pytest.approx(0.0015)
    assert fleet.live[S.IN_FLIGHT].tolist() == [0, 0]  # ended once: nothing went below zero
