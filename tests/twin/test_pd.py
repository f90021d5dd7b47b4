"""Prefill/decode disaggregation in the twin: fleets from the example YAML files, transfer time accounted."""

import random
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from steersman.config import DEFAULTS
from steersman.fleet.config import FleetConfigError, load_fleet, parse_fleet
from steersman.policy import make_policy
from steersman.sim import model_profile
from steersman.testing import ReplayWorkload
from steersman.twin import ReplicaPlan, Twin, TwinConfig, TwinFleet, summarize
from steersman.twin.metrics import per_replica
from steersman.twin.results import OK

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MODEL = "llama-3.1-8b"


@dataclass(frozen=True, slots=True)
class _A:
    time: float
    seq: int
    prompt_tokens: int
    block_hashes: tuple
    output_tokens: int
    tenant: str = "t"
    model: str = MODEL
    max_tokens: int | None = None
    slo_class: str | None = None
    deadline_s: float | None = None
    workflow: str | None = None
    step: int | None = None
    steps: int | None = None


def _long(n: int, rate: float, seed: int = 5) -> ReplayWorkload:
    """Long unique prompts (4,000-8,000 tokens) and long outputs (200-400 tokens)."""
    rng = random.Random(seed)
    t, items = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        p = rng.randint(4000, 8000)
        items.append(_A(t, i, p, tuple(hash((seed, i, j)) for j in range(p // 16)), rng.randint(200, 400)))
    return ReplayWorkload(items)


def _run(fleet: TwinFleet, wl, policy: str = "least-request"):
    twin = Twin(fleet, wl, make_policy(policy, fleet.scheduler), cfg=TwinConfig())
    return twin, twin.run()


def test_example_fleets_parse_with_roles_and_link():
    pd = TwinFleet.from_config(load_fleet(EXAMPLES / "twin-fleet-disaggregated.yaml"))
    co = TwinFleet.from_config(load_fleet(EXAMPLES / "twin-fleet-colocated.yaml"))
    assert [p.role for p in pd.plans] == ["prefill", "prefill", "decode", "decode"] and pd.disaggregated
    assert pd.kv_link_gbit_s == 400 and not co.disaggregated and len(co.plans) == len(pd.plans)
    # the routing policy sees decode replicas under a model name no request asks for
    assert pd.build_state(None).models() == [f"{MODEL}", f"{MODEL}@decode"]


@pytest.mark.parametrize("bad, msg", [
    ({"role": "middle"}, "role must be both, prefill or decode"),
    ({"role": "prefill"}, "has prefill replicas but no decode ones"),
])
def test_bad_roles_are_refused_naming_the_field(bad, msg):
    with pytest.raises(FleetConfigError, match=msg):
        parse_fleet({"simulated": {"replicas": [{"gpu": "H100", "model": MODEL, **bad}]}})


def test_disaggregation_improves_tpot_on_long_prompts_and_outputs():
    """Colocated, every 4-8k-token prefill stalls the decoding batch of its replica for 0.1-0.2 s (a third of
    the time at this load); disaggregated, decode replicas only decode -- with twice the batch each, so the gain
    is what is left after that (measured: TPOT p50 -19%, p90 -27%; TTFT +43% from the busier prefill pool and
    the transfer).  Same 4 H100s, same arrivals."""
    co = TwinFleet.from_config(load_fleet(EXAMPLES / "twin-fleet-colocated.yaml"))
    pd = TwinFleet.from_config(load_fleet(EXAMPLES / "twin-fleet-disaggregated.yaml"))
    wl = _long(300, 10.0)
    _, rc = _run(co, _long(300, 10.0))
    twin, rp = _run(pd, _long(300, 10.0))
    sc, sp = summarize(rc), summarize(rp)
    assert sc["completed"] == sp["completed"] == 300
    assert sp["tpot_s"]["p50"] < 0.9 * sc["tpot_s"]["p50"], (sp["tpot_s"], sc["tpot_s"])
    assert sp["tpot_s"]["p90"] < 0.85 * sc["tpot_s"]["p90"], (sp["tpot_s"], sc["tpot_s"])
    assert sp["ttft_s"]["p50"] > sc["ttft_s"]["p50"]  # the price: a busier prefill pool, plus the transfer
    # the work really was split: prefill replicas computed every prompt, decode replicas every later token
    states = rp.engine_states
    prompts = sum(a.prompt_tokens for a in wl.items)
    assert states[0].prompt_tokens_total + states[1].prompt_tokens_total == prompts
    assert states[2].prompt_tokens_total == states[3].prompt_tokens_total == 0
    outs = sum(a.output_tokens for a in wl.items)
    assert states[2].generation_tokens_total + states[3].generation_tokens_total == outs - 300
    assert min(states[2].generation_tokens_total, states[3].generation_tokens_total) > 0.3 * (outs - 300)
    assert (twin.fleet.in_flight == 0).all()  # every request settled, its hand-off to a decode replica included
    # results.json's per_replica: the decode replicas' part shows as attempts (their `requests`: none are last there)
    reps = per_replica(rp)
    assert reps[0]["attempts"] + reps[1]["attempts"] == 300 == reps[2]["attempts"] + reps[3]["attempts"]
    assert reps[2]["requests"] == reps[3]["requests"] == 0 and min(reps[2]["attempts"], reps[3]["attempts"]) > 50


def _single(link_gbit_s: float, prompt: int = 8000, out: int = 50):
    fleet = TwinFleet([ReplicaPlan("p", "H100", MODEL, role="prefill"), ReplicaPlan("d", "H100", MODEL, role="decode")],
                      kv_link_gbit_s=link_gbit_s)
    wl = ReplayWorkload([_A(0.5, 0, prompt, tuple(range(1, prompt // 16 + 1)), out)])
    _, rec = _run(fleet, wl, "round-robin")
    c = rec.arrays()
    assert c["status"][0] == OK and c["output"][0] == out
    return c["first"][0] - c["arrival"][0], c["finish"][0] - c["first"][0], rec


def test_transfer_time_is_prompt_kv_bytes_over_the_link():
    prompt = 8000
    ttft_fast, decode_fast, _ = _single(400.0, prompt)
    ttft_slow, decode_slow, rec = _single(10.0, prompt)
    kv_bytes = prompt * model_profile(MODEL).kv_bytes_per_token  # 8,000 x 128 KiB = ~1 GB
    expected = kv_bytes / (10e9 / 8) - kv_bytes / (400e9 / 8)
    assert expected > 0.7  # a visible part of TTFT
    assert ttft_slow - ttft_fast == pytest.approx(expected, rel=1e-9)
    assert decode_slow == pytest.approx(decode_fast, rel=1e-9)  # decoding does not depend on the link
    # and TTFT = queueing + prefill + transfer: at 400 Gb/s the transfer is kv_bytes / 50 GB/s
    assert DEFAULTS.engine.kv_link_gbit_s == 400.0
    prefill_only, _, _ = _single_colocated(prompt)
    assert ttft_fast == pytest.approx(prefill_only + kv_bytes / (400e9 / 8), rel=1e-9)
    assert rec.busy[1] > 0 and rec.engine_states[1].prompt_tokens_total == 0


def _single_colocated(prompt: int):
    fleet = TwinFleet([ReplicaPlan("c", "H100", MODEL)])
    wl = ReplayWorkload([_A(0.5, 0, prompt, tuple(range(1, prompt // 16 + 1)), 1)])
    _, rec = _run(fleet, wl, "round-robin")
    c = rec.arrays()
    return c["first"][0] - c["arrival"][0], None, rec


def test_decode_replica_death_fails_its_requests_and_later_ones_go_to_the_other():
    fleet = TwinFleet.from_config(load_fleet(EXAMPLES / "twin-fleet-disaggregated.yaml"))
    twin = Twin(fleet, _long(120, 3.0), make_policy("least-request", fleet.scheduler), cfg=TwinConfig())
    twin.schedule_drill(10.0, lambda tw: tw.kill(2))
    rec = twin.run()
    s = summarize(rec)
    assert 0 < s["failed"] < 30 and s["completed"] == 120 - s["failed"]
    assert rec.engine_states[3].generation_tokens_total > rec.engine_states[2].generation_tokens_total
    assert (twin.fleet.in_flight == 0).all()  # every hand-off settled, the failed ones included
    assert not twin.fleet.healthy[2]  # the first transfer to reach the dead replica marked it unhealthy
    assert np.isfinite(rec.arrays()["finish"]).all()


def test_the_live_gateway_says_it_does_not_disaggregate():
    # role is a twin setting: `steersman up/serve` on such a fleet warns that every replica serves requests whole
    from steersman.fleet.embedded import twin_only_roles

    pd = load_fleet(EXAMPLES / "twin-fleet-disaggregated.yaml").simulated
    co = load_fleet(EXAMPLES / "twin-fleet-colocated.yaml").simulated
    assert twin_only_roles(pd) == ["2 x H100 llama-3.1-8b (role: prefill)", "2 x H100 llama-3.1-8b (role: decode)"]
    assert twin_only_roles(co) == []


class _LastDecode:
    """A decode picker for the test: the highest-index available decode replica, whatever its load."""

    name = "test-last"

    def pick_decode(self, snapshot, request, prefill):
        from steersman.policy.base import Reject, Route
        from steersman.policy.decode import decode_model

        ok = np.flatnonzero(snapshot.model_masks[decode_model(request.model)] & snapshot.routable)
        return Route(int(ok[-1]), "last") if ok.size else Reject("none")


def test_the_decode_replica_is_the_control_planes_choice():
    """The twin hands each KV to the replica the configured decode picker names (the scheduler setting
    ``decode_picker``): the default spreads decode work by load, a custom picker sends it all to replica 3."""
    from steersman.policy.decode import DECODE_PICKERS

    if "test-last" not in DECODE_PICKERS:
        DECODE_PICKERS.register("test-last", _LastDecode)
    base = TwinFleet.from_config(load_fleet(EXAMPLES / "twin-fleet-disaggregated.yaml"))
    custom = TwinFleet(base.plans, replace(base.scheduler, decode_picker="test-last"), base.admission, base.kv_link_gbit_s)
    _, rd = _run(base, _long(60, 3.0))
    twin, rc = _run(custom, _long(60, 3.0))
    d, c = rd.engine_states, rc.engine_states
    assert min(d[2].generation_tokens_total, d[3].generation_tokens_total) > 0  # least-loaded: both decode
    assert c[2].generation_tokens_total == 0 and c[3].generation_tokens_total > 0  # the custom picker: all on 3
    assert summarize(rc)["completed"] == 60 and (twin.fleet.in_flight == 0).all()


def test_the_fleet_accounts_a_request_where_its_work_is():
    """The control plane's view of a disaggregated request: on the prefill replica until its KV reaches the
    decode replica (the client's first token), on the decode replica from its pick to the end.  Before, the
    prefill replica counted it in flight and decoding until it finished elsewhere, and looked loaded with
    decode work it did not have."""
    from steersman.fleet import snapshot as S

    def fleet():
        return TwinFleet([ReplicaPlan("p", "H100", MODEL, role="prefill"), ReplicaPlan("d", "H100", MODEL, role="decode")],
                         kv_link_gbit_s=10.0)

    def workload():
        return ReplayWorkload([_A(0.5, 0, 8000, tuple(range(1, 501)), 200)])

    _, rec = _run(fleet(), workload(), "round-robin")
    c = rec.arrays()
    first, finish = c["first"][0], c["finish"][0]
    transfer = 8000 * model_profile(MODEL).kv_bytes_per_token / (10e9 / 8)
    seen = {}
    twin = Twin(fleet(), workload(), make_policy("round-robin", fleet().scheduler), cfg=TwinConfig())
    for name, t in (("moving", first - transfer / 2), ("decoding", (first + finish) / 2), ("after", finish + 1.0)):
        twin.schedule_drill(t, lambda tw, name=name: seen.__setitem__(name, tw.fleet.live[[S.IN_FLIGHT, S.DECODING]].copy()))
    twin.run()
    assert seen["moving"].tolist() == [[1, 1], [0, 0]]  # its KV on the way: both count it, neither decodes it
    assert seen["decoding"].tolist() == [[0, 1], [0, 1]]  # the decode replica alone, decoding it
    assert seen["after"].tolist() == [[0, 0], [0, 0]]
    # the prefill replica learnt the TTFT the client saw (prefill and transfer), its decode replica the TPOT
    assert twin.fleet.live[S.TTFT_EWMA, 0] == pytest.approx(first - c["arrival"][0], rel=1e-9)
    assert np.isnan(twin.fleet.live[S.TTFT_EWMA, 1])
    assert twin.fleet.live[S.TPOT_EWMA, 1] == pytest.approx((finish - first) / 199, rel=1e-6)


def test_prefill_replicas_predict_the_kv_hand_off_in_ttft():
    """A prefill replica's first token reaches the client once the KV moved: its predicted TTFT (both the
    plugin path and the fused decision use predict_kernel) adds prompt tokens x the hand-off seconds per token,
    KV bytes per token over the link (x its TP shards); colocated and decode replicas add nothing."""
    from steersman.fleet import snapshot as S
    from steersman.policy.framework import DecisionContext
    from steersman.testing.snapshots import sched_request

    plans = [ReplicaPlan("p", "H100", MODEL, role="prefill"), ReplicaPlan("p2", "H100", MODEL, tp=2, role="prefill"),
             ReplicaPlan("d", "H100", MODEL, role="decode"), ReplicaPlan("c", "H100", MODEL)]
    from steersman.twin.clock import VirtualClock

    slow, fast = (TwinFleet(plans, kv_link_gbit_s=g).build_state(VirtualClock()) for g in (10.0, 1e9))
    per_token = model_profile(MODEL).kv_bytes_per_token / (10e9 / 8)
    assert slow.statics.matrix[10].tolist() == pytest.approx([per_token, per_token / 2, 0.0, 0.0])
    req = sched_request(prompt_tokens=4000, expected_output=100)

    def ttft(fleet):
        snap = fleet.snapshot()
        return DecisionContext(snap, req, snap.candidates(MODEL)).feature("prediction").ttft

    t_slow, t_fast = ttft(slow), ttft(fast)  # candidates: the two prefill replicas and the colocated one
    assert t_slow - t_fast == pytest.approx([4000 * per_token, 2000 * per_token, 0.0], rel=1e-3)
    assert np.isnan(slow.live[S.TTFT_RATIO]).all()  # no correction learnt yet: the ratio prior is 1
