"""The shortlist (above ``k`` candidates) chooses among the replicas the ``fits-kv`` filter keeps: those whose free
KV cache holds the request, else those whose whole cache holds it with the most KV free now.  It used to rank every
candidate by load, prefix and price alone: in a fleet of many small-HBM replicas and one or two large ones, it dropped
the large ones, the only ones that could hold a long prompt, and the request got a 503 (retried, failing again) instead
of going to them.  ``[shortlist, fits-kv]`` now decides as ``[fits-kv, shortlist]``, in both decision paths."""

from __future__ import annotations

import itertools

import pytest
from replayscenarios import describe, random_cases

from steersman.config import DEFAULTS
from steersman.policy import make_policy
from steersman.policy.base import Route
from steersman.policy.framework import Profile, WeightedScorer
from steersman.policy.model_based import SloCheapest
from steersman.policy.saturation import Saturation
from steersman.policy.scorers import FitsKv, KvHeadroom, LoadBalance, PrefixAffinity, Shortlist
from steersman.testing.snapshots import fleet_snapshot, sched_request

SMALL, BIG = 1000.0, 4000.0  # KV blocks of 16 tokens: an L40S replica's 16,000 tokens, an H200's 64,000


def _fleet(smalls: int, bigs: dict[int, float]):
    """``smalls`` idle L40S replicas and H200s at the positions of ``bigs`` (position: KV usage), each decoding 3
    requests: neither load (the L40S are idle) nor price (an L40S's TFLOP/s is cheaper) shortlists an H200."""
    gpus, total, use, load = [], [], [], []
    for i in range(smalls + len(bigs)):
        big = i in bigs
        gpus.append("H200" if big else "L40S")
        total.append(BIG if big else SMALL)
        use.append(bigs[i] if big else 0.0)
        load.append(3.0 if big else 0.0)
    return fleet_snapshot(gpus, kv_blocks_total=total, kv_usage=use, in_flight=load, decoding=load, running=load)


def _both(snap, req):
    policy = make_policy("steersman")
    assert policy._fast is not None
    fast, slow = policy.pick(snap, req), policy.decide(policy.context(snap, req))
    assert describe(fast) == describe(slow)
    return fast


@pytest.mark.parametrize("smalls,bigs", [(40, {40: 0.0}), (60, {10: 0.0, 55: 0.0}), (999, {500: 0.0})])
def test_a_prompt_only_the_big_replicas_hold_goes_to_one_of_them(smalls, bigs):
    snap = _fleet(smalls, bigs)
    assert snap.statics.gpu_names[snap.statics.gpu_class[min(bigs)]] == "H200"
    d = _both(snap, sched_request(prompt_tokens=30_000, expected_output=100, max_tokens=100))
    assert isinstance(d, Route), d  # was a 503: "those ... that do are busy, out of rotation or excluded"
    assert d.replica in bigs


def test_a_big_replica_without_the_room_free_now_still_takes_it_the_one_with_most_free():
    # neither H200's free KV holds 30,100 tokens now (25,600 and 19,200 free): the request waits in the engine
    # queue of the one with the most free, as when the shortlist does not act (FitsKv.when_empty)
    snap = _fleet(40, {3: 0.6, 20: 0.7})
    d = _both(snap, sched_request(prompt_tokens=30_000, expected_output=100, max_tokens=100))
    assert isinstance(d, Route) and d.replica == 3, d
    small = _fleet(20, {3: 0.6, 20: 0.7})  # no shortlist at 22 candidates: the same answer
    assert _both(small, sched_request(prompt_tokens=30_000, expected_output=100, max_tokens=100)).replica == 3


def test_the_shortlist_keeps_the_replicas_whose_free_kv_holds_the_request():
    # 40 L40S: the 20 least loaded have 4,000 tokens free (below saturation's 80%), the other 20 all of their
    # 16,000; a 5,000-token request went to one of the fuller ones (the only ones shortlisted) to wait there for
    # blocks, not to one with the room free
    usage = [0.75] * 20 + [0.0] * 20
    load = [0.0] * 20 + [2.0] * 20
    snap = fleet_snapshot(["L40S"] * 40, kv_blocks_total=SMALL, kv_usage=usage, in_flight=load, decoding=load,
                          running=load)
    d = _both(snap, sched_request(prompt_tokens=5_000, expected_output=100))
    assert isinstance(d, Route) and d.replica >= 20, d


def test_the_shortlist_keeps_only_k_of_them():
    snap = _fleet(30, {i: 0.0 for i in range(30, 70)})  # 40 H200s hold it: the shortlist still keeps 32 at most
    policy = make_policy("steersman")
    ctx = policy.context(snap, sched_request(prompt_tokens=30_000, expected_output=100, max_tokens=100))
    keep = Shortlist(32).filter(ctx)
    assert 0 < keep.sum() <= 32 and not keep[:30].any()
    few = Shortlist(32).filter(policy.context(_fleet(40, {5: 0.0, 9: 0.0}), ctx.request))
    assert few.nonzero()[0].tolist() == [5, 9]
    # none holds it: the shortlist ranks them all, and fits-kv answers (a 400: no replica of the model ever could)
    none = Shortlist(32).filter(policy.context(_fleet(40, {}), ctx.request))
    assert 0 < none.sum() <= 32
    d = _both(_fleet(40, {}), ctx.request)
    assert d.status == 400 and d.code == "context_length_exceeded"


CASES = list(itertools.islice(random_cases(), 900))


def test_shortlist_then_fits_kv_decides_as_fits_kv_then_shortlist():
    s = DEFAULTS.scheduler

    def profile(filters):
        return Profile("p", filters, [WeightedScorer(PrefixAffinity(), 2.0), WeightedScorer(KvHeadroom(), 1.0),
                                      WeightedScorer(LoadBalance(), 1.0)], SloCheapest(s), Saturation(s))

    # a profile each run: the picker counts each model's tied decisions (SloCheapest.tie_break)
    first, after, fused = (profile([Shortlist(8), FitsKv()]), profile([FitsKv(), Shortlist(8)]),
                           profile([Shortlist(8), FitsKv()]))
    assert fused._fast is not None
    cases = CASES + [(_fleet(40, {40: 0.0}), sched_request(prompt_tokens=30_000, expected_output=100)),
                     (_fleet(40, {3: 0.6, 20: 0.7}), sched_request(prompt_tokens=30_000, expected_output=100))]
    a = [describe(first.decide(first.context(snap, req))) for snap, req in cases]
    b = [describe(after.decide(after.context(snap, req))) for snap, req in cases]
    assert a == b
    assert [describe(fused.pick(snap, req)) for snap, req in cases] == a  # the fused path too
    assert sum(x.startswith("route") for x in a) > len(cases) // 2
