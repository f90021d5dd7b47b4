"""Round-robin, random, least-request, power-of-two: determinism (by seq; round-robin by its count per model) and
the load rules."""

from __future__ import annotations

import collections
from dataclasses import replace

import numpy as np
import pytest
from baselinehelpers import MODEL, request, snapshot

from steersman.config import DEFAULTS
from steersman.policy import POLICIES, Reject, Route
from steersman.policy.baselines import BASELINES


def make(name):
    return POLICIES.get(name)(DEFAULTS.scheduler)


@pytest.mark.parametrize("name", BASELINES)
def test_registered_never_queue_and_reject_without_candidates(name):
    pol = make(name)
    assert pol.name == name
    assert getattr(pol, "saturation", None) is None
    snap = snapshot(3, routable=[False, False, False])
    assert isinstance(pol.pick(snap, request(0)), Reject)


@pytest.mark.parametrize("name", BASELINES)
def test_every_profile_routes_to_a_candidate_deterministically(name):
    pol, again = make(name), make(name)
    snap = snapshot(5, routable=[True, False, True, True, False], in_flight=[3, 0, 1, 2, 0])
    for seq in range(20):
        d = pol.pick(snap, request(seq))
        assert isinstance(d, Route) and d.replica in (0, 2, 3)
        assert pol.pick(snap, request(seq)) == d  # asked again: the same
        assert again.pick(snap, request(seq)) == d  # the same requests in the same order: the same decisions


def test_round_robin_cycles_through_the_candidates():
    pol = make("round-robin")
    snap = snapshot(4, routable=[True, True, False, True], in_flight=[9, 0, 0, 5])
    assert [pol.pick(snap, request(s)).replica for s in range(6)] == [0, 1, 3, 0, 1, 3]


OTHER = "qwen2.5-7b"


def _two_models(n: int = 4, **rows):
    """Replicas 0..n/2-1 serve MODEL, the others OTHER."""
    half = np.arange(n) < n // 2
    snap = snapshot(n, **rows)
    return replace(snap, model_masks={MODEL: half, OTHER: ~half})


def test_round_robin_counts_per_model_when_models_interleave():
    """The gateway's request counter (seq) is shared by every model: rotating on it, two models' alternating
    requests each went to one replica of their two.  A counter per model (Envoy: per cluster) spreads both."""
    pol = make("round-robin")
    snap = _two_models()
    picks = collections.Counter()
    order = {MODEL: [], OTHER: []}
    for seq in range(1000):
        model = MODEL if seq % 2 == 0 else OTHER
        r = pol.pick(snap, replace(request(seq), model=model)).replica
        picks[r] += 1
        order[model].append(r)
    assert dict(picks) == {0: 250, 1: 250, 2: 250, 3: 250}
    assert order[MODEL][:4] == [0, 1, 0, 1] and order[OTHER][:4] == [2, 3, 2, 3]


@pytest.mark.parametrize("name", ["least-request", "dynamo-kv", "preble-e2", "sglang-cache-aware"])
def test_ties_are_drawn_from_a_hash_of_seq_not_its_parity(name):
    """Equal candidates: the choice among them must not follow seq's parity, which interleaved models share."""
    pol = make(name)
    snap = _two_models()
    picks = collections.Counter(pol.pick(snap, replace(request(seq), model=MODEL)).replica for seq in range(0, 400, 2))
    assert set(picks) == {0, 1} and min(picks.values()) > 60, picks


def test_random_is_a_function_of_seq_and_spreads():
    pol = make("random")
    snap = snapshot(4)
    picks = [pol.pick(snap, request(s)).replica for s in range(2000)]
    assert picks == [pol.pick(snap, request(s)).replica for s in range(2000)]
    counts = collections.Counter(picks)
    assert set(counts) == {0, 1, 2, 3} and min(counts.values()) > 400
    assert picks[:8] != [s % 4 for s in range(8)]  # not round-robin in disguise


def test_least_request_takes_min_in_flight_and_rotates_ties_by_seq():
    pol = make("least-request")
    assert pol.pick(snapshot(3, in_flight=[4, 1, 2]), request(7)).replica == 1
    tied = snapshot(4, in_flight=[2, 0, 5, 0])
    assert {pol.pick(tied, request(s)).replica for s in range(4)} == {1, 3}


def test_power_of_two_never_picks_the_worse_of_its_pair():
    pol = make("power-of-two")
    two = snapshot(2, in_flight=[7, 3])
    assert {pol.pick(two, request(s)).replica for s in range(50)} == {1}
    loads = np.array([5.0, 1.0, 9.0, 3.0, 7.0])
    snap = snapshot(5, in_flight=loads)
    picks = [pol.pick(snap, request(s)).replica for s in range(500)]
    assert 2 not in picks  # the most loaded always loses its comparison
    assert len(set(picks)) == 4  # but it is not least-request: the two choices vary with seq
    assert picks == [pol.pick(snap, request(s)).replica for s in range(500)]
