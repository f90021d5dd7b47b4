"""Prefix affinity in the steersman profile, on the fused path and the plugin-by-plugin path.

* A replica holding most of a request's prompt (the index's raw match reaches ``exploit_share``)
  is saturated for that request only at ``saturation_affinity_factor`` x the queue depth, whatever
  its KV usage: the request joins that replica's queue instead of waiting in the gateway for
  whichever replica frees first.  Other requests still wait.
* The holders-first rule reads the index's raw match, not the residency-discounted one the
  predictions use: a holder whose index entries outnumber its KV cache is still preferred.
"""

from dataclasses import replace

import numpy as np
import pytest

from steersman.config import DEFAULTS
from steersman.policy import Queue, Route, make_policy
from steersman.policy.framework import DecisionContext
from steersman.testing.snapshots import chain, fleet_snapshot, prefix_index, sched_request

SET = DEFAULTS.scheduler
DEPTH = SET.saturation_queue_depth
OVER = DEPTH + 1  # a queue past the depth: saturated (at the depth a replica still has capacity, as in GIE)
HASHES = chain("tenant-prompt", 64)


def _policy(fused: bool):
    p = make_policy("steersman", SET)
    if not fused:
        p._fast = None  # the plugin-by-plugin path
    return p


def _request(held_share: float = 1.0, seq: int = 0):
    """A 64-block prompt whose first ``held_share`` is held by replica 0."""
    return sched_request(seq, hashes=HASHES), prefix_index(2, {0: HASHES[: int(64 * held_share)]})


@pytest.mark.parametrize("fused", [True, False])
def test_a_saturated_holder_takes_its_request_and_the_gateway_queue_keeps_the_rest(fused):
    policy = _policy(fused)
    req, index = _request()
    snap = fleet_snapshot(2, prefix=index, waiting=[OVER, OVER])
    d = policy.pick(snap, req)
    assert isinstance(d, Route) and d.replica == 0
    other = sched_request(1, hashes=chain("someone else", 64))  # no holder: waits for the first replica to free
    assert isinstance(policy.pick(snap, other), Queue)
    # the holder is only saturated for it at the affinity factor x the depth
    deep = fleet_snapshot(2, prefix=index, waiting=[DEPTH * SET.saturation_affinity_factor + 1, OVER])
    assert isinstance(policy.pick(deep, req), Queue)
    at_factor = fleet_snapshot(2, prefix=index, waiting=[DEPTH * SET.saturation_affinity_factor, OVER])
    assert policy.pick(at_factor, req).replica == 0


@pytest.mark.parametrize("fused", [True, False])
def test_kv_usage_does_not_saturate_a_holder(fused):
    policy = _policy(fused)
    req, index = _request()
    snap = fleet_snapshot(2, prefix=index, kv_usage=[0.95, 0.95])
    assert policy.pick(snap, req).replica == 0
    assert isinstance(policy.pick(snap, sched_request(1, hashes=chain("x", 64))), Queue)


@pytest.mark.parametrize("fused", [True, False])
def test_a_short_match_gets_no_exemption(fused):
    policy = _policy(fused)
    req, index = _request(held_share=SET.exploit_share * 0.75)
    snap = fleet_snapshot(2, prefix=index, waiting=[OVER, OVER])
    assert isinstance(policy.pick(snap, req), Queue)


@pytest.mark.parametrize("fused", [True, False])
def test_a_resumed_stream_still_ignores_saturation(fused):
    req, index = _request()
    other = replace(sched_request(1, hashes=chain("x", 64)), resumed=True)
    snap = fleet_snapshot(2, prefix=index, waiting=[OVER, OVER])
    assert isinstance(_policy(fused).pick(snap, other), Route)


@pytest.mark.parametrize("fused", [True, False])
def test_holders_first_reads_the_raw_match_not_the_residency_discount(fused):
    """Replica 0 holds the whole prompt, but its index entries are over 3x its KV cache, so the predictions
    credit it with under a third of the prompt (under exploit_share); it decodes a batch of 100, replica 1
    is idle, so without holders-first the idle one wins.  Holders-first on the raw match sends it to the holder."""
    policy = _policy(fused)
    index = prefix_index(2, {0: HASHES}, max_bytes=64 << 20)
    for k in range(4):  # more of replica 0's history in the index: 320 blocks indexed for a 100-block cache
        index.record(0, chain(("history", k), 64))
    req = sched_request(hashes=HASHES, expected_output=50)
    snap = fleet_snapshot(2, prefix=index, kv_blocks_total=[100.0, 100.0], running=[100, 0],
                          in_flight=[100, 0], decoding=[100, 0])
    blocks = DecisionContext(snap, req, snap.candidates(req.model)).feature("prefix_blocks")
    assert blocks[0] * 16 < SET.exploit_share * req.prompt_tokens  # discounted: not worth exploiting
    never_exploits = make_policy("steersman", replace(SET, exploit_share=1.01))
    if not fused:
        never_exploits._fast = None
    assert never_exploits.pick(snap, req).replica == 1
    d = policy.pick(snap, req)
    assert isinstance(d, Route) and d.replica == 0


@pytest.mark.parametrize("fused", [True, False])
def test_a_prompt_every_replica_holds_waits_in_the_gateway_queue(fused):
    """No affinity to keep: the gateway queue (priority order) sends it to a holder anyway."""
    index = prefix_index(2, {0: HASHES, 1: HASHES})
    snap = fleet_snapshot(2, prefix=index, waiting=[OVER, OVER])
    assert isinstance(_policy(fused).pick(snap, sched_request(hashes=HASHES)), Queue)
    one_free = fleet_snapshot(2, prefix=index, waiting=[OVER, 0])
    assert _policy(fused).pick(one_free, sched_request(hashes=HASHES)).replica == 1




def test_the_queue_check_passes_the_match_type_decisions_pass():
    """The gateway queue's check (no request: no match) passes a read-only int64 array like the prefix index's
    match results, so its first use on live traffic neither compiles nor loads another specialization."""
    from steersman.policy.kernels import saturation_kernel
    from steersman.policy.saturation import saturated

    req, index = _request()
    snap = fleet_snapshot(2, prefix=index, waiting=[OVER, OVER])
    saturated(snap, np.arange(2), SET)  # the queue's check
    _policy(False).pick(snap, req)  # a decision, through the Saturation hook
    held_types = {sig[7] for sig in saturation_kernel.signatures}
    assert len(held_types) == 1 and not next(iter(held_types)).mutable, held_types
