"""Priority reaching the engine: to an endpoint declared ``scheduling: priority`` (vLLM --scheduling-policy
priority: lower ``priority`` first, then arrival) the gateway sends 2 x the request's band, plus 1 when no replica
was predicted to meet its SLO (``scheduler.demote_late``); to an fcfs engine (vLLM's default, which refuses a
non-zero priority) it sends none.  The twin passes the same value to its engine model."""

from dataclasses import replace

import openai
import orjson
import pytest

from steersman.config import DEFAULTS
from steersman.control import generate_key
from steersman.control.accounting import engine_priority
from steersman.pipeline.forward import with_priority
from steersman.policy import Route, make_policy
from steersman.policy.request import LatencyBudget, PriorityClass
from steersman.testing import LiveFleet
from steersman.testing.scripted import Script
from steersman.testing.snapshots import chain, fleet_snapshot, prefix_index, sched_request


def test_the_priority_is_the_last_member_so_the_gateways_value_wins():
    assert orjson.loads(with_priority(b"{}", 3)) == {"priority": 3}
    assert orjson.loads(with_priority(b' {"a": {"b": [1, 2]}} \n', 0)) == {"a": {"b": [1, 2]}, "priority": 0}
    client_set = with_priority(b'{"priority": -5, "model": "m"}', 2)
    assert client_set.endswith(b',"priority":2}') and orjson.loads(client_set)["priority"] == 2  # last one wins
    with pytest.raises(ValueError):
        with_priority(b"[1, 2]", 1)


def test_bands_keep_their_order_and_late_requests_go_last_inside_theirs():
    on_time, late = Route(0), Route(0, late=True)
    got = {(c, r.late): engine_priority(sched_request(priority=c), r, DEFAULTS.scheduler)
           for c in PriorityClass for r in (on_time, late)}
    assert [got[(c, False)] for c in PriorityClass] == [0, 2, 4, 6]
    assert [got[(c, True)] for c in PriorityClass] == [1, 3, 5, 7]  # a late critical still before any standard
    plain = replace(DEFAULTS.scheduler, demote_late=False)
    assert engine_priority(sched_request(), late, plain) == 2


@pytest.mark.parametrize("fused", [True, False])
def test_the_route_says_late_only_when_no_replica_is_predicted_to_meet_the_slo(fused):
    policy = make_policy("steersman")
    if not fused:
        policy._fast = None
    snap = fleet_snapshot(2)
    ok = policy.pick(snap, sched_request(prompt_tokens=800, budget=LatencyBudget(ttft_s=2.0, tpot_s=0.2)))
    assert isinstance(ok, Route) and not ok.late
    late = policy.pick(snap, sched_request(prompt_tokens=8000, budget=LatencyBudget(ttft_s=0.05, tpot_s=0.2)))
    assert isinstance(late, Route) and late.late and late.reason.startswith("no replica meets the SLO")
    # kept with its prompt's holder while another replica meets the SLO (the stay rule): the fleet could have
    # met it, so the engine does not demote it
    hashes = chain("ctx", 120)
    held = fleet_snapshot(2, prefix=prefix_index(2, {0: hashes}), running=[60, 0], in_flight=[60, 0],
                          decoding=[60, 0])
    stay = policy.pick(held, sched_request(prompt_tokens=120 * 16 + 100, hashes=hashes, expected_output=100,
                                           budget=LatencyBudget(ttft_s=2.0, tpot_s=0.0105)))
    assert stay.reason.startswith("holder of its prompt") and not stay.late


def _tenants():
    keys, entries = {}, []
    for name, band in (("crit", "critical"), ("std", "standard"), ("bulk", "batch")):
        k, digest = generate_key()
        keys[name] = k
        entries.append({"sha256": digest, "tenant": name})
    tenants = {"crit": {"priority": "critical"}, "std": {"priority": "standard"}, "bulk": {"priority": "batch"}}
    slo = {"standard": {"ttft_s": 2.0, "tpot_s": 0.2}, "instant": {"ttft_s": 1e-6, "tpot_s": 0.2},
           "batch": {"ttft_s": None, "tpot_s": None}}
    return keys, {"tenants": tenants, "api_keys": entries, "scheduler": {"slo_classes": slo}}


def test_a_priority_engine_gets_each_requests_priority_an_fcfs_engine_none():
    keys, extra = _tenants()
    messages = [{"role": "user", "content": "hello there"}]
    with LiveFleet(scripted=[Script(model="m", scheduling="priority")], extra=extra) as lf:
        for tenant, headers in (("crit", {}), ("std", {}), ("bulk", {}), ("std", {"x-steersman-slo": "instant"})):
            c = openai.OpenAI(base_url=lf.url + "/v1", api_key=keys[tenant], max_retries=0)
            out = c.chat.completions.create(model="m", messages=messages, max_tokens=4, extra_headers=headers)
            assert out.choices[0].message.content == "Hello, world."
        assert [b["priority"] for b in lf.scripted[0].seen.bodies] == [0, 2, 6, 3]
    # an fcfs engine refuses a non-zero priority, as vLLM does: the gateway sends it none
    with LiveFleet(scripted=[Script(model="m")], extra=extra) as lf:
        c = openai.OpenAI(base_url=lf.url + "/v1", api_key=keys["std"], max_retries=0)
        stream = c.chat.completions.create(model="m", messages=messages, max_tokens=4, stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == "Hello, world."
        assert "priority" not in lf.scripted[0].seen.bodies[0]


def test_the_fleet_file_names_the_scheduling_policy_and_refuses_others():
    from steersman.fleet.config import FleetConfigError, parse_fleet

    cfg = parse_fleet({"endpoints": [{"url": "http://127.0.0.1:1", "scheduling": "priority"}],
                       "simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "scheduling": "priority"}]}})
    assert cfg.endpoints[0].scheduling == "priority" and cfg.simulated.replicas[0].scheduling == "priority"
    with pytest.raises(FleetConfigError, match=r"endpoints\[0\].scheduling must be fcfs or priority"):
        parse_fleet({"endpoints": [{"url": "http://127.0.0.1:1", "scheduling": "sjf"}]})
    with pytest.raises(FleetConfigError, match=r"simulated.replicas\[0\].scheduling"):
        parse_fleet({"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "scheduling": "lifo"}]}})
