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


def test_max_tokens_past_every_cache_is_a_400_though_the_expected_output_fits():
    """A llama.cpp audit: a 10-token prompt with ``max_tokens`` 100,000 (an 8,192-token cache) was routed on its
    expected output, which fit the free KV, and ran ~80 s to the context's end; ``fits-kv`` now also asks each
    replica's whole cache for the prompt and ``max_tokens`` (vLLM refuses it too)."""
    snap = _snap([1000.0, 2000.0], [0.0, 0.0])  # 16,000 and 32,000 tokens, idle
    d = _both(snap, _req(10, 100, max_tokens=100_000))
    assert isinstance(d, Reject) and (d.status, d.code) == (400, "context_length_exceeded") and "`max_tokens`" in d.reason
    # one only the larger cache holds whole goes there, though the smaller has the room for its expected output
    for _ in range(4):
        d = _both(snap, _req(10, 100, max_tokens=20_000))
        assert isinstance(d, Route) and d.replica == 1


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


# --- "can any replica ever hold it" is asked of every replica serving the model, not of those left in play ------

def _big_and_small() -> FleetSnapshot:
    """Replica 0's cache holds 48,000 tokens, replica 1's 16,000 (a smaller deployment of the model)."""
    return _snap([3000.0, 1000.0], [0.0, 0.0])


def _unavailable(snap: FleetSnapshot, req: SchedRequest):
    policy = make_policy("steersman")
    fast, slow = policy.pick(snap, req), policy.decide(policy.context(snap, req))
    for d in (fast, slow):
        assert isinstance(d, Reject)
        assert (d.status, d.code, d.param) == (503, "no_capacity", None) and d.retry_after is None, d  # (the plane's wait)
    return fast


def test_the_big_replica_saturated_is_a_503_not_a_400():
    snap = _big_and_small()
    req = _req(30_000, 10, max_tokens=10)
    assert _both(snap, req).replica == 0  # idle: it goes to the replica that holds it
    busy = _snap([3000.0, 1000.0], [0.0, 0.0])
    busy.live[S.LIVE_FIELDS.index("waiting")] = [6.0, 0.0]  # past the saturation queue depth: replica 0 drops out
    busy.live[S.LIVE_FIELDS.index("running")] = [30.0, 0.0]
    d = _unavailable(busy, req)
    assert "30010 tokens" in d.reason


def test_the_big_replica_excluded_ejected_or_down_is_a_503_not_a_400():
    snap = _big_and_small()
    req = _req(30_000, 10, max_tokens=10)
    _unavailable(snap, replace(req, excluded=frozenset({0})))  # a retry avoiding the replica that failed it
    _unavailable(replace(snap, blocked_until=np.array([130.0, 0.0])), req)  # ejected for 30 s
    down = replace(snap, routable=np.array([False, True]), healthy=np.array([False, True]))
    _unavailable(down, req)  # failing its health checks: no candidate, still a replica of the model


def test_larger_than_every_replica_of_the_model_stays_a_400_whatever_is_in_play():
    snap = _big_and_small()
    d = _both(replace(snap, routable=np.array([False, True])), _req(50_000, 10))
    assert isinstance(d, Reject) and (d.status, d.code) == (400, "context_length_exceeded")
    assert "48000 tokens" in d.reason  # the largest cache serving the model, not the largest still in play


def test_a_replica_of_unknown_capacity_out_of_play_makes_it_a_503():
    snap = _snap([np.nan, 1000.0], [0.0, 0.0])
    snap = replace(snap, statics=replace(snap.statics, kv_blocks=np.array([np.nan, 1000.0])),
                   routable=np.array([False, True]))
    _unavailable(snap, _req(30_000, 10))


# --- a batch of prompts: each is a sequence of its own ------------------------------------------------------------

def _batch(total: int, longest: int | None, kind: str, max_tokens: int | None) -> SchedRequest:
    return replace(_req(total, 1 if kind == "embedding" else 16, max_tokens=max_tokens, kind=kind),
                   longest_prompt_tokens=longest)


@pytest.mark.parametrize("kind,max_tokens", [("embedding", 1), ("completion", 16)])
def test_a_batch_whose_inputs_each_fit_goes_to_the_replica_with_most_kv_free(kind, max_tokens):
    snap = _snap([2000.0, 3000.0], [0.0, 0.5])  # 32,000 and 48,000 tokens; 32,000 and 24,000 free
    # 100 inputs of ~1,001 tokens: 100,100 in all, more than either cache, each far under it
    d = _both(snap, _batch(100_100, 1_001, kind, max_tokens))
    assert isinstance(d, Route) and d.replica == 0
    # no longest given: the prompt is one sequence of 100,100 tokens, as before
    d = _both(snap, _batch(100_100, None, kind, max_tokens))
    assert isinstance(d, Reject) and d.status == 400


def test_a_batch_whose_longest_input_fits_nowhere_is_a_400_naming_it():
    snap = _snap([2000.0, 3000.0], [0.0, 0.0])
    d = _both(snap, _batch(60_000, 50_000, "embedding", 1))
    assert isinstance(d, Reject) and (d.status, d.param) == (400, "input")
    assert "50001 tokens" in d.reason and "longest entry of the input" in d.reason and "max_tokens" not in d.reason


def test_longest_prompt_defaults_to_the_prompt():
    r = _req(1234, 10)
    assert r.longest_prompt_tokens is None and r.longest_prompt == 1234
    assert replace(r, longest_prompt_tokens=99).longest_prompt == 99
    assert replace(r, longest_prompt_tokens=99).kv_tokens == r.kv_tokens  # the load counts every input


def test_a_shortfall_decision_compiles_nothing_after_the_warm_up():
    """kv_shortfall calls its kernel from Python with the snapshot's read-only rows (a numba type of their own):
    the warm-up ran it with writable arrays only, so the first request no replica's free KV held compiled it on the
    gateway's event loop.  A fresh interpreter, as a gateway process starts (here, other tests compiled much).  (The
    plugin-by-plugin path is covered live by tests/reliability/test_no_compile_on_request_path.py: this test's
    hand-made snapshot differs from a fleet's in arrays that path's other kernels read.)"""
    import subprocess
    import sys
    from pathlib import Path

    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from steersman.policy import kernels, plugin_kernels
kernels.warm_up()
from test_kv_shortfall import _snap, _req
from steersman.policy import make_policy
def counts():  # the kernels kv_shortfall calls from Python (the others' types are this hand-made snapshot's)
    return {{k.__name__: len(k.signatures) for k in (plugin_kernels.kv_keep_kernel,)}}
before = counts()
snap = _snap([1000.0, 2000.0], [0.9, 0.7])  # free 1,600 and 9,600 tokens: neither holds 12,010 now
snap.live.flags.writeable = False  # as every fleet snapshot's
policy = make_policy("steersman")
before = counts()
print(policy.pick(snap, _req(12000, 10)))  # the fused path (the gateway's, for the default profile)
added = {{k: n - before.get(k, 0) for k, n in counts().items() if n != before.get(k, 0)}}
print(added)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "{}", run.stdout
