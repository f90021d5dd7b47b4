"""Values a fleet file may hold that the loader used to accept (then start-up crashed, or the gateway ran wrongly)
or refused with a traceback / a message naming another key: each is a FleetConfigError naming the key written."""

import math

import pytest

from steersman.fleet.config import FleetConfigError, load_fleet, make_profile, parse_fleet

_EP = {"endpoints": [{"url": "http://127.0.0.1:1", "models": ["m"]}]}


def _refused(doc: dict, field: str, says: str) -> None:
    with pytest.raises(FleetConfigError) as e:
        parse_fleet(doc, "f.yaml")
    assert str(e.value).startswith(f"f.yaml: {field}"), str(e.value)
    assert says in str(e.value), str(e.value)


@pytest.mark.parametrize("section, values, field, says", [
    # what Gateway.start (gateway_cmd) raised on with a traceback
    ("admission", {"default_priority": "bogus"}, "admission.default_priority", "critical, standard, sheddable, batch"),
    ("gateway", {"admin_key_sha256": "notahash"}, "gateway.admin_key_sha256", "64 hex digits"),
    ("gateway", {"response_store_url": "http://x"}, "gateway.response_store_url", "redis://"),
    ("gateway", {"host": ""}, "gateway.host", "every interface"),
    # Redis refuses SET PX past its expiry range: every store write failed
    ("gateway", {"response_store_ttl_s": 1e17}, "gateway.response_store_ttl_s", "<= 3.1536e+08"),
    # math.isfinite(10**400) raised OverflowError
    ("gateway", {"max_body_bytes": 10**400}, "gateway.max_body_bytes", "401-digit integer"),
    ("admission", {"workflow_max_entries": 0}, "admission.workflow_max_entries", ">= 1"),
    ("scheduler", {"saturation_affinity_factor": 0}, "scheduler.saturation_affinity_factor", "> 0"),
    ("scheduler", {"slot_wait_gain": 2}, "scheduler.slot_wait_gain", "0 to 1"),  # a slower wait would do
    ("reliability", {"retry_budget_percent": 150}, "reliability.retry_budget_percent", "0 to 100"),
    # reported as scheduler.balance_tie / scheduler.latency_tie
    ("scheduler", {"kv_headroom_tie": 1}, "scheduler.kv_headroom_tie", "< 1"),
    ("scheduler", {"late_latency_tie": 5}, "scheduler.late_latency_tie", "exploit_slowdown"),
    ("scheduler", {"latency_ewma_alpha": math.inf}, "scheduler.latency_ewma_alpha", "finite"),
])
def test_a_value_start_up_or_the_gateway_would_trip_on_is_refused_naming_its_key(section, values, field, says):
    _refused({**_EP, section: values}, field, says)


def test_a_valid_admin_digest_and_store_url_still_load():
    cfg = parse_fleet({**_EP, "gateway": {"admin_key_sha256": " " + "AB" * 32 + "\n",
                                          "response_store_url": "rediss://cache:6380/2", "response_store_ttl_s": 3e8},
                       "admission": {"default_priority": "Critical"}})
    assert cfg.gateway.response_store_ttl_s == 3e8
    parse_fleet({**_EP, "gateway": {"response_store_url": "unix:///run/redis.sock"}})


@pytest.mark.parametrize("body, field, says", [
    (5, "scheduler.slo_classes.standard", "must be a mapping"),
    (True, "scheduler.slo_classes.standard", "must be a mapping"),
    (["ttft_s"], "scheduler.slo_classes.standard", "must be a mapping"),
    ("fast", "scheduler.slo_classes.standard", "got a string"),  # was "unknown field(s) ['a', 'f', 's', 't']"
    ({"ttft_s": math.nan}, "scheduler.slo_classes.standard.ttft_s", "positive number"),
    ({"tpot_s": math.nan}, "scheduler.slo_classes.standard.tpot_s", "positive number"),
    ({"ttft_s": 10**400}, "scheduler.slo_classes.standard.ttft_s", "positive number"),
])
def test_an_slo_class_that_is_not_a_mapping_of_finite_targets_is_refused(body, field, says):
    _refused({**_EP, "scheduler": {"slo_classes": {"standard": body}}}, field, says)


def test_an_slo_class_without_targets_still_loads():
    cfg = parse_fleet({**_EP, "scheduler": {"slo_classes": {"standard": {"ttft_s": 1}, "batch": None, "bulk": {}}}})
    assert cfg.scheduler.slo_classes["batch"].ttft_s is None and cfg.scheduler.slo_classes["standard"].ttft_s == 1.0


@pytest.mark.parametrize("value, field, says", [
    ({"a": 5}, "reliability.brownout_models.a", "model names are strings"),  # was "Expected `str`... at `$[...]`"
    (["a"], "reliability.brownout_models", "must map model names"),
])
def test_brownout_models_errors_name_the_key(value, field, says):
    _refused({**_EP, "reliability": {"brownout_models": value}}, field, says)


def test_a_simulated_replica_with_tp_zero_is_named_by_its_key():
    _refused({"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "tp": 0}]}},
             "simulated.replicas[0].tp", "must be >= 1, got 0")


def _profile(spec) -> dict:
    return {**_EP, "policy": "p", "scheduler": {"profiles": {"p": spec}}}


@pytest.mark.parametrize("spec, field, says", [
    ({"scorers": [{"type": "kv-headroom", "wieght": 5}]}, "scorers[0]", "unknown field(s) ['wieght']"),
    ({"scorers": [{"type": "kv-headroom", "param": {"tie": 0.5}}]}, "scorers[0]", "unknown field(s) ['param']"),
    ({"scorers": {"prefix-affinity": 3, "load-balance": 0}}, "scorers", "must be a list"),  # iterated its keys
    ({"filters": "fits-kv"}, "filters", "must be a list"),  # was "unknown scheduling filter 'f'"
    ({"scorers": [5]}, "scorers[0]", "must be a plugin name or a mapping"),  # was "'int' object is not subscriptable"
    ({"scorers": [{"weight": 2}]}, "scorers[0].type", "must name the plugin"),  # was "'type'"
    ({"scorers": [{"type": "kv-headroom", "weight": math.inf}]}, "scorers[0].weight", "finite number >= 0"),
    ({"scorers": [{"type": "kv-headroom", "weight": True}]}, "scorers[0].weight", "finite number >= 0"),
    ({"scorers": [{"type": "kv-headroom", "weight": 10**400}]}, "scorers[0].weight", "finite number >= 0"),
    ({"scorers": [{"type": "kv-headroom", "weight": "3"}]}, "scorers[0].weight", "finite number >= 0"),
    ({"scorers": [{"type": "kv-headroom", "params": ["tie"]}]}, "scorers[0].params", "must map"),
    ({"filters": [{"type": "fits-kv", "weight": 2}]}, "filters[0]", "unknown field(s) ['weight']"),
    ({"queue_when_saturated": "no"}, "queue_when_saturated", "true or false"),  # "no" was truthy
    ({"picker": None}, "picker", "must be a plugin name"),
    ({"scorers": [{"type": "prefix-afinity"}]}, "scorers[0]", "unknown scheduling scorer 'prefix-afinity'"),
    # an AttributeError from the plugin's constructor was a traceback; its knobs are the scheduler's settings
    ({"picker": {"type": "slo-cheapest", "params": {"settings": {"safety_margin": 0.5}}}}, "picker (slo-cheapest)",
     "takes no params"),
    ({"scorers": [{"type": "kv-headroom", "params": {"nope": 1}}]}, "scorers[0] (kv-headroom)", "nope"),
])
def test_a_profile_item_of_the_wrong_shape_is_refused_naming_it(spec, field, says):
    _refused(_profile(spec), f"scheduler.profiles.p.{field}", says)


def test_a_well_formed_profile_still_builds():
    spec = {"filters": ["shortlist", {"type": "fits-kv"}],
            "scorers": [{"type": "prefix-affinity", "weight": 3}, "kv-headroom",
                        {"type": "load-balance", "weight": 0, "params": {"tie": 0.1}}],
            "picker": {"type": "max-score"}, "queue_when_saturated": False}
    cfg = parse_fleet(_profile(spec))
    prof = make_profile("p", cfg.profiles["p"], cfg.scheduler)
    assert [w.weight for w in prof.scorers] == [3.0, 1.0, 0.0] and prof.saturation is None


def test_the_gateway_starts_a_bounded_number_of_engine_sims():
    # 100,000 were accepted, and `serve` OOM-killed the machine spawning them
    from steersman.fleet.config import check_spawnable

    cfg = parse_fleet({"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "count": 100_000}]}})
    with pytest.raises(FleetConfigError, match=r"100,000 engine-sim processes; the gateway starts at most 256"):
        check_spawnable(cfg.simulated, "f.yaml")
    from steersman.fleet.embedded import SimulatedFleet

    with pytest.raises(FleetConfigError, match="at most 256"):
        SimulatedFleet(cfg.simulated)
    ok = parse_fleet({"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "count": 200},
                                                 {"gpu": "A100", "model": "llama-3.1-8b", "count": 56}]}})
    check_spawnable(ok.simulated, "f.yaml")


def test_simulated_replicas_are_spawned_a_bounded_number_at_a_time():
    import asyncio
    import os

    cfg = parse_fleet({"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "count": 40}]}}).simulated
    from steersman.fleet.embedded import SimulatedFleet

    running = peak = 0

    async def spawn(name, spec, gpu, model):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)  # yields: every spawn not held back would be running here at once
        running -= 1
        return name

    fleet = SimulatedFleet(cfg)
    fleet._spawn = spawn
    assert len(asyncio.run(fleet.start())) == 40
    assert peak == max(8, os.cpu_count() or 1) < 40


def test_a_fleet_file_that_is_not_utf8_is_refused(tmp_path):
    f = tmp_path / "fleet.yaml"
    f.write_bytes(b"\xff\xfe" + "endpoints: []\n".encode("utf-16-le"))
    with pytest.raises(FleetConfigError, match=r"cannot read .*fleet.yaml: not UTF-8 text"):
        load_fleet(f)


def test_a_key_given_twice_is_refused_naming_it_and_its_lines(tmp_path):
    f = tmp_path / "fleet.yaml"
    f.write_text("endpoints: [{url: 'http://127.0.0.1:9'}]\ngateway: {port: 9001}\ngateway: {max_logprobs: 5}\n")
    with pytest.raises(FleetConfigError, match=r"duplicate key 'gateway' on line 3 \(first given on line 2\)"):
        load_fleet(f)
    f.write_text("endpoints: [{url: 'http://127.0.0.1:9'}]\ngateway: {port: 9001, port: 9002}\n")
    with pytest.raises(FleetConfigError, match=r"duplicate key 'port'"):
        load_fleet(f)
    # a merge key's values may be overridden (YAML's own rule)
    f.write_text("endpoints:\n  - &b {url: 'http://127.0.0.1:9', models: [m]}\n  - {<<: *b, url: 'http://127.0.0.1:8'}\n")
    assert [e.url for e in load_fleet(f).endpoints] == ["http://127.0.0.1:9", "http://127.0.0.1:8"]
