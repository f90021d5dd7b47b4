"""When no replica's free KV cache holds a request (the ``fits-kv`` filter keeps none): a request larger than every
replica's whole cache is the client's to change (400 ``context_length_exceeded`` naming the prompt's field, not a
503 its client retries); one that some replica could hold once KV frees goes to the one of those with the most KV free
now (its engine queues it; held in the gateway it would starve behind smaller requests).  The fused path
and the plugin-by-plugin path answer alike."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from replayscenarios import MODEL, describe

from steersman.fleet import snapshot as S
from steersman.fleet.snapshot import FleetSnapshot
from steersman.fleet.statics import ReplicaSpec, build_statics
from steersman.policy import make_policy
from steersman.policy.base import Reject, Route
from steersman.policy.request import LatencyBudget, PriorityClass, SchedRequest

BLOCK = 16


def _snap(totals: list[float], usage: list[float]) -> FleetSnapshot:
    n = len(totals)
    live = np.zeros((len(S.LIVE_FIELDS), n))
    live[S.LIVE_FIELDS.index("kv_blocks_total")] = totals
    live[S.LIVE_FIELDS.index("kv_usage")] = usage
    live[S.LIVE_FIELDS.index("weights")] = S.WEIGHTS_CODES["warm"]
    live[S.LIVE_FIELDS.index("scraped_at")] = 99.9
    for name in ("ttft_ewma", "tpot_ewma", "ttft_ratio", "tpot_ratio", "prefix_accuracy", "stalled_since"):
        live[S.LIVE_FIELDS.index(name)] = np.nan
    statics = build_statics([ReplicaSpec("H100-SXM", MODEL, 1, 2.0)] * n)
    ok = np.ones(n, dtype=bool)
    return FleetSnapshot(time=100.0, names=tuple(f"r{i}" for i in range(n)), gpus=("H100-SXM",) * n, pools=("p",) * n,
                         model_masks={MODEL: ok}, healthy=ok.copy(), routable=ok.copy(), live=live, statics=statics,
                         prefix=None, ttft_prior=1.0, tpot_prior=1.0, recent_at=None, recent_tau_s=60.0)


def _req(prompt: int, expected: int, max_tokens: int | None = None, kind: str = "chat") -> SchedRequest:
    return SchedRequest(seq=1, model=MODEL, kind=kind, stream=True, tenant="t", priority=PriorityClass.STANDARD,
                        arrival=100.0, prompt_tokens=prompt, block_hashes=(), max_tokens=max_tokens,
                        expected_output=expected, budget=LatencyBudget())


def _both(snap, req):
    policy = make_policy("steersman")
    assert policy._fast is not None
    fast, slow = policy.pick(snap, req), policy.decide(policy.context(snap, req))
    assert describe(fast) == describe(slow)
    assert type(fast) is type(slow)
    if isinstance(fast, Reject):
        assert (fast.status, fast.code, fast.param) == (slow.status, slow.code, slow.param)
    return fast


@pytest.mark.parametrize("kind,field", [("chat", "messages"), ("completion", "prompt")])
def test_larger_than_every_replicas_cache_is_a_400_naming_the_prompt(kind, field):
    snap = _snap([1000.0, 2000.0], [0.0, 0.5])  # 16,000 and 32,000 tokens
    d = _both(snap, _req(32_001, 10, kind=kind))
    assert isinstance(d, Reject)
    assert (d.status, d.code, d.param, d.retry_after) == (400, "context_length_exceeded", field, None)
    assert "32002 tokens" in d.reason and "32000 tokens" in d.reason and field in d.reason
    # max_tokens counts in full: the prompt fits, the prompt and max_tokens do not
    d = _both(snap, _req(30_000, 10, max_tokens=2_001, kind=kind))
    assert isinstance(d, Reject) and d.status == 400 and "`max_tokens`" in d.reason


def test_a_request_only_a_busy_replica_could_hold_goes_where_most_kv_is_free():
    # free: 4,800, 12,800 and 8,000 tokens (below saturation); the request needs 20,500; the third's cache is too small
    snap = _snap([1000.0, 2000.0, 1000.0, 3000.0], [0.7, 0.6, 0.5, np.nan])
    d = _both(snap, _req(20_000, 500))
    assert isinstance(d, Route) and d.replica == 1  # not the unscraped one: none of its KV is known free
    snap = _snap([2000.0, 2000.0], [0.7, 0.6])
    assert _both(snap, _req(20_000, 500)).replica == 1


def test_only_the_estimated_output_overflowing_goes_to_the_replicas_holding_prompt_and_max_tokens():
    snap = _snap([1000.0, 2000.0], [0.0, 0.0])
    # 31,000 prompt + 2,000 expected > 32,000 anywhere; prompt + 1 fits only the larger replica
    d = _both(snap, _req(31_000, 2_000))
    assert isinstance(d, Route) and d.replica == 1


def test_a_replica_with_unknown_capacity_takes_anything():
    snap = _snap([1000.0, np.nan], [0.0, 0.0])
    snap = replace(snap, statics=replace(snap.statics, kv_blocks=np.array([1000.0, np.nan])))
    d = _both(snap, _req(10**6, 10))
    assert isinstance(d, Route) and d.replica == 1
