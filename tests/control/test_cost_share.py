"""A request's cost is its share of its replica's time: each moment's price divided among the requests in flight
there at that moment (Fleet._accrue), so the requests that shared a replica together pay what its busy time cost,
however many joined or left when.  Before, each paid its whole stay divided by the batch it joined (1 + the
engine's running/decoding count at its dispatch): a burst of N to an idle replica paid N times the replica."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.control.test_retry_accounting import PRICE, _advance, _go, _setup

from steersman.fleet import snapshot as S

PER_S = PRICE / 3600.0  # $0.001 a second


@pytest.mark.parametrize("stream", [False, True])
def test_a_burst_to_an_idle_replica_pays_the_replica_once(stream):
    clock, fleet, acc, plane, flows, req, admit = _setup()
    tenant = admit.tenant
    burst = []
    for i in range(10):
        r = replace(req, seq=i, stream=stream, workflow=None)
        burst.append(_go(acc, r, plane.admitter.admit(r, tenant, clock.now()), 0))
    _advance(clock, 0.05)
    for s in burst:
        if stream:
            acc.first_token(s)
    _advance(clock, 9.95)
    costs = []
    for s in burst:
        if not stream:
            acc.first_token(s)  # a whole response: its "first token" is its end
        costs.append(acc.ended(s, 16, True))
    assert costs == pytest.approx([PER_S * 10.0 / 10] * 10)  # 10 s of the replica, shared by 10 all along
    assert sum(costs) == pytest.approx(PER_S * 10.0)  # was 10x: each paid 10 s / a batch of 1
    assert plane.admitter.ledger.spent("t") == pytest.approx(PER_S * 10.0)


def test_requests_that_overlap_for_a_while_split_only_that_while():
    """A alone 2 s, with B 2 s, then B alone 2 s: each pays 2 s alone + half of 2 s shared."""
    clock, fleet, acc, plane, flows, req, admit = _setup()
    a = _go(acc, replace(req, workflow=None), admit, 0)
    _advance(clock, 0.1)
    acc.first_token(a)  # decoding when B joins: B's old "batch" was 2, and A's stayed 1 for its whole stay
    _advance(clock, 1.9)
    rb = replace(req, seq=2, workflow=None)
    b = _go(acc, rb, plane.admitter.admit(rb, admit.tenant, clock.now()), 0)
    _advance(clock, 2.0)
    assert acc.ended(a, 16, True) == pytest.approx(PER_S * 3.0)  # was 4 s
    _advance(clock, 2.0)
    assert acc.ended(b, 16, True) == pytest.approx(PER_S * 3.0)  # was 2 s
    assert plane.admitter.ledger.spent("t") == pytest.approx(PER_S * 6.0)  # the replica's 6 busy seconds
    assert fleet.live[S.IN_FLIGHT, 0] == 0


def test_an_idle_gap_costs_nobody_and_replicas_are_apart():
    clock, fleet, acc, plane, flows, req, admit = _setup()
    tenant = admit.tenant
    r0, r1 = replace(req, workflow=None), replace(req, seq=2, workflow=None)
    a = _go(acc, r0, admit, 0)
    b = _go(acc, r1, plane.admitter.admit(r1, tenant, clock.now()), 1)
    _advance(clock, 1.0)
    assert acc.ended(a, 16, True) == pytest.approx(PER_S * 1.0)
    _advance(clock, 100.0)  # replica 0 idle: nobody pays for it
    r2 = replace(req, seq=3, workflow=None)
    c = _go(acc, r2, plane.admitter.admit(r2, tenant, clock.now()), 0)
    _advance(clock, 1.0)
    assert acc.ended(c, 16, True) == pytest.approx(PER_S * 1.0)
    assert acc.ended(b, 16, True) == pytest.approx(PER_S * 102.0)  # alone on replica 1 all along


def test_a_failed_attempt_carries_its_share_into_the_retry():
    clock, fleet, acc, plane, flows, req, admit = _setup()
    tenant = admit.tenant
    other = replace(req, seq=2, workflow=None)
    o = _go(acc, other, plane.admitter.admit(other, tenant, clock.now()), 0)
    first = _go(acc, req, admit, 0)  # shares replica 0 with ``o`` for 2 s: $0.001
    _advance(clock, 2.0)
    gone = acc.left(first)
    assert gone.earlier_cost == pytest.approx(PER_S * 1.0)
    second = _go(acc, req, admit, 1, earlier=gone)
    _advance(clock, 1.0)
    assert acc.ended(second, 16, True) == pytest.approx(PER_S * 2.0)
    assert acc.ended(o, 16, True) == pytest.approx(PER_S * 2.0)  # 1 s shared, then 1 s alone
