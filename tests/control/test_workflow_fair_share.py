"""The workflow tracker's cap is shared fairly across tenants: one tenant sending random workflow ids evicted every
other tenant's entries (one global LRU: at 200 requests/s the others' sunk cost was gone in ~8 minutes); now at the cap
the least recently used entry of the tenant holding the most goes."""

from __future__ import annotations

import gc
import random
import tracemalloc

import pytest

from steersman.config.admission import AdmissionSettings
from steersman.control.workflow import WorkflowHeaders, WorkflowTracker


def _tracker(cap: int, ttl: float = 3600.0) -> WorkflowTracker:
    return WorkflowTracker(AdmissionSettings(workflow_max_entries=cap, workflow_idle_ttl_s=ttl))


def _held(t: WorkflowTracker) -> dict[str, int]:
    counts: dict[str, int] = {}
    for tenant, _ in t._states:
        counts[tenant] = counts.get(tenant, 0) + 1
    return counts


def test_a_flooding_tenant_evicts_its_own_entries_not_another_tenants():
    t = _tracker(cap=50)
    for i in range(5):  # tenant A: a handful of workflows that have spent money
        t.admitted("a", f"task-{i}", 10, 0.0)
        t.record("a", f"task-{i}", tokens=100 * (i + 1), cost_usd=0.5 * (i + 1), now=1.0)
    for i in range(1000):  # tenant B: random ids, 20x the cap, each newer than A's last call
        t.admitted("b", f"junk-{i}", None, 2.0 + i * 0.01)
        assert len(t) <= 50  # the cap holds at every step
    assert len(t) == 50
    assert _held(t) == {"a": 5, "b": 45}
    for i in range(5):  # A's entries all survive, with what they spent
        v = t.peek("a", WorkflowHeaders(f"task-{i}", None, None), 20.0)
        assert (v.calls, v.tokens, v.spent_usd, v.steps, v.started) == (1, 100 * (i + 1), 0.5 * (i + 1), 10, 0.0)
    # B's oldest went, its most recent 45 are kept
    assert [wid for tenant, wid in t._states if tenant == "b"] == [f"junk-{i}" for i in range(955, 1000)]


def test_a_tenant_below_its_fair_share_keeps_its_entries_while_another_is_above_it():
    t = _tracker(cap=10)
    for i in range(8):
        t.admitted("b", f"b{i}", None, float(i))
    for i in range(2):
        t.admitted("a", f"a{i}", None, 10.0 + i)  # fills the cap: 8 + 2
    for i in range(3):  # A grows: B (above its share of 5) gives up its least recently used, A's stay
        t.admitted("a", f"a{2 + i}", None, 20.0 + i)
    assert _held(t) == {"a": 5, "b": 5}
    assert [wid for tenant, wid in t._states if tenant == "b"] == ["b3", "b4", "b5", "b6", "b7"]
    t.admitted("b", "b3", None, 30.0)  # B refreshes its oldest: its least recently used is now b4
    t.admitted("a", "a5", None, 31.0)  # A at 6, above B: A's own least recently used goes
    assert _held(t) == {"a": 5, "b": 5}
    assert ("a", "a0") not in t._states and ("b", "b4") in t._states
    t.admitted("c", "c0", None, 32.0)  # a new tenant's first: a tie at 5, the one that has held 5 longest (A) gives
    assert _held(t) == {"a": 4, "b": 5, "c": 1}
    assert ("a", "a1") not in t._states and ("b", "b4") in t._states
    t.admitted("c", "c1", None, 33.0)  # now B holds the most
    assert _held(t) == {"a": 4, "b": 4, "c": 2}
    assert ("b", "b4") not in t._states


def test_two_flooding_tenants_share_the_cap_evenly_and_a_quiet_tenant_keeps_its_entries():
    t = _tracker(cap=100)
    for i in range(3):
        t.record("quiet", f"q{i}", tokens=1, cost_usd=2.0, now=0.0)
    for i in range(5000):  # x floods twice as fast as y
        now = 1.0 + i * 0.001
        t.admitted("x", f"x-{i}", None, now)
        if i % 2 == 0:
            t.admitted("y", f"y-{i}", None, now)
    held = _held(t)
    assert len(t) == 100 and held["quiet"] == 3
    assert abs(held["x"] - held["y"]) <= 1 and held["x"] + held["y"] == 97
    assert all(t.peek("quiet", WorkflowHeaders(f"q{i}", None, None), 10.0).spent_usd == 2.0 for i in range(3))


def test_many_tenants_at_the_cap_are_evicted_in_turn():
    """Tenants tied for the most give up entries in turn (the one that reached the count first), so the counts stay
    within one of each other."""
    t = _tracker(cap=30)
    for i in range(300):
        t.admitted(f"t{i % 7}", f"w{i}", None, float(i))
        counts = _held(t).values()
        assert len(t) <= 30 and max(counts) - min(counts) <= 1


def test_idle_entries_of_any_tenant_expire_first():
    t = _tracker(cap=4, ttl=100.0)
    t.record("a", "old", tokens=1, cost_usd=1.0, now=0.0)  # goes idle
    for i in range(3):
        t.record("b", f"b{i}", tokens=1, cost_usd=1.0, now=50.0 + i)
    t.admitted("b", "b3", None, 100.0)  # at the cap; "a"'s entry idle for 100 s expired, though "b" holds the most
    assert _held(t) == {"b": 4}
    assert t.peek("a", WorkflowHeaders("old", None, None), 100.0).calls == 0
    v = t.peek("b", WorkflowHeaders("b0", None, None), 100.0)
    assert (v.calls, v.spent_usd) == (1, 1.0)
    t.admitted("c", "c0", None, 150.5)  # b0 (last seen at 50) expired: swept, nothing else goes
    assert _held(t) == {"b": 3, "c": 1}
    t.admitted("c", "c1", None, 150.5)  # at the cap again, nothing idle: "b", holding the most, gives b1
    assert _held(t) == {"b": 2, "c": 2} and ("b", "b1") not in t._states


def test_an_idle_entry_reused_is_a_new_task_and_counts_once():
    t = _tracker(cap=3, ttl=100.0)
    t.record("a", "w", tokens=5, cost_usd=1.0, now=0.0)
    t.admitted("b", "x", None, 90.0)
    t.admitted("b", "y", None, 90.0)
    v = t.track("a", WorkflowHeaders("w", None, None), 150.0)  # idle past its TTL: starts over, still one entry
    assert (v.calls, v.spent_usd, v.started) == (0, 0.0, 150.0)
    assert _held(t) == {"a": 1, "b": 2}
    t.admitted("c", "z", None, 151.0)  # cap: "b" holds the most
    assert _held(t) == {"a": 1, "b": 1, "c": 1}
    assert ("a", "w") in t._states and ("b", "x") not in t._states


def _check_books(t: WorkflowTracker) -> None:
    """The tracker's per-tenant books agree with its entries."""
    held = _held(t)
    assert {tenant: len(ids) for tenant, ids in t._tenants.items()} == held
    for tenant, ids in t._tenants.items():  # each tenant's ids in the order of the global LRU
        assert list(ids) == [wid for owner, wid in t._states if owner == tenant]
    assert {n: set(group) for n, group in t._holding.items()} == {
        n: {tenant for tenant, c in held.items() if c == n} for n in set(held.values())}
    assert t._most == max(held.values(), default=0)


@pytest.mark.parametrize("seed", range(4))
def test_random_traffic_evicts_the_least_recently_used_of_a_tenant_holding_the_most(seed):
    rng = random.Random(seed)
    t = _tracker(cap=40, ttl=1e9)
    last: dict[tuple[str, str], int] = {}  # the step each entry was last touched
    weights = [20, 5, 3, 1, 1]
    for step in range(3000):
        tenant = rng.choices(["a", "b", "c", "d", "e"], weights)[0]
        mine = [k for k in t._states if k[0] == tenant]
        key = rng.choice(mine) if mine and rng.random() < 0.4 else (tenant, f"w{step}")
        before = set(t._states)
        counts = _held(t)
        counts[tenant] = counts.get(tenant, 0) + (key not in before)
        if rng.random() < 0.5:
            t.admitted(*key, None, float(step))
        else:
            t.record(*key, tokens=1, cost_usd=0.01, now=float(step))
        last[key] = step
        gone = before - set(t._states)
        assert len(t) == min(len(before | {key}), 40) and key in t._states
        if gone:
            (victim,) = gone
            assert counts[victim[0]] == max(counts.values())
            assert last[victim] == min(s for k, s in last.items() if k[0] == victim[0] and k in before)
            del last[victim]
        _check_books(t)


def test_the_books_stay_right_as_entries_expire_and_tenants_come_and_go():
    rng = random.Random(7)
    t = _tracker(cap=25, ttl=30.0)
    now = 0.0
    for step in range(3000):
        now += rng.choice([0.0, 0.1, 1.0, 5.0])
        tenant = rng.choice(["a", "b", "c", "d"])
        t.admitted(tenant, f"w{rng.randrange(60)}", None, now)
        assert len(t) <= 25
        assert all(s.last_seen + 30.0 > now for s in t._states.values())  # nothing idle is kept
        _check_books(t)


def test_the_memory_held_at_the_cap_is_what_its_settings_state():
    """``workflow_max_entries``' source: 100k workflows, ids of the longest allowed (256 characters), costs recorded,
    at ~0.8 KB each (~80 MB).  Measured at the cap with 10 tenants: 815 bytes (the single LRU before fair share:
    715)."""
    cap = 100_000
    t = _tracker(cap)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(cap + cap // 10):
            tenant, wid = f"tenant-{i % 10}", f"{i:08d}" + "x" * 248
            t.admitted(tenant, wid, 7, i * 1e-4)
            t.record(tenant, wid, tokens=1000, cost_usd=0.0123, now=i * 1e-4 + 5e-5)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(t) == cap
    assert held / cap <= 850, held / cap
