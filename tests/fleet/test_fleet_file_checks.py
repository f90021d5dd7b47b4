"""A fleet file the gateway (or the twin) cannot run is refused at load, naming the field: never a traceback at
startup, an engine-sim that exits, or a silently different fleet."""

import pytest

from steersman.fleet.config import FleetConfigError, load_fleet, parse_fleet, with_gateway
from steersman.sim import EngineModel, gpu_profile, model_profile
from steersman.sim.memory import check_tensor_parallel
from steersman.config import EngineSettings


def _sim(**replica) -> dict:
    return {"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", **replica}]}}


def _ep(**endpoint) -> dict:
    return {"endpoints": [{"url": "http://127.0.0.1:1", "models": ["m"], **endpoint}]}


@pytest.mark.parametrize("doc, field, says", [
    (_sim(gpu="H999"), "simulated.replicas[0].gpu", "unknown GPU 'H999'"),
    (_sim(model="nope-1b"), "simulated.replicas[0].model", "unknown model 'nope-1b'"),
    (_sim(gpu="L40S", model="llama-3.1-70b"), "simulated.replicas[0]", "does not fit on 1 x L40S"),
    (_sim(tp=0), "simulated.replicas[0].tp", "must be >= 1, got 0"),  # the key written, not the engine's name
    (_sim(tp=3), "simulated.replicas[0]", "32 attention heads must be divisible by tensor_parallel (3)"),
    (_sim(model="qwen2.5-7b", tp=8), "simulated.replicas[0]", "28 attention heads"),
    ({"simulated": {"speedup": 0, "replicas": [{"gpu": "H100", "model": "llama-3.1-8b"}]}}, "simulated.speedup",
     "must be > 0"),
    (_ep(gpu="H999"), "endpoints[0].gpu", "give price_per_hour"),
    (_ep(tp=0), "endpoints[0].tp", "must be >= 1"),
    (_ep(price_per_hour=-3), "endpoints[0].price_per_hour", "must be a number >= 0"),
    (_ep(price_per_hour=float("nan")), "endpoints[0].price_per_hour", "must be a number >= 0"),
    ({**_ep(), "gateway": {"port": 99999}}, "gateway.port", "must be 0 to 65535"),
    ({**_ep(), "gateway": {"metrics_interval_s": 0}}, "gateway.metrics_interval_s", "must be > 0"),
    ({**_ep(), "gateway": {"admin_key_sha256": 123}}, "gateway.admin_key_sha256", "Expected `str | null`"),
    ({**_ep(), "gateway": {"otlp_traces_endpoint": "collector:4318"}}, "gateway.otlp_traces_endpoint", "http(s) URL"),
    ({**_ep(), "scheduler": {"cost_tie": -1}}, "scheduler.cost_tie", "must be >= 1"),
    ({**_ep(), "reliability": {"breaker_error_percent": 150}}, "reliability.breaker_error_percent", "<= 100"),
    ({**_ep(), "admission": {"rate_burst_s": float("nan")}}, "admission.rate_burst_s", "got nan"),
    # what Gateway.start failed on with a traceback (its adapter, its connection address)
    (_ep(engine="vlm"), "endpoints[0].engine", "unknown engine 'vlm'; known: engine-sim, llamacpp"),
    (_ep(url="http://"), "endpoints[0].url", "has no host"),
    (_ep(url="http://:8000"), "endpoints[0].url", "has no host"),
    (_ep(url="http://127.0.0.1:99999"), "endpoints[0].url", "port that is not a number 1 to 65535"),
    (_ep(url="http://127.0.0.1:80a"), "endpoints[0].url", "port that is not a number 1 to 65535"),
    (_ep(url="http://127.0.0.1:0"), "endpoints[0].url", "port that is not a number 1 to 65535"),
    ({"endpoints": [{"url": "http://127.0.0.1:1", "name": "a", "models": ["m"]},
                    {"url": "http://127.0.0.1:2", "name": "b", "models": ["m"]},
                    {"url": "http://127.0.0.1:3", "name": "a", "models": ["m"]}]},
     "endpoints[2].name", "'a' is already the name of endpoints[0]"),
    ({**_ep(name="h100-sxm-1"), **_sim(count=2)}, "endpoints[0].name",
     "'h100-sxm-1' is the name of a simulated replica (simulated.replicas[0])"),
    ({**_ep(name="main-0"), **_sim(pool="main")}, "endpoints[0].name", "'main-0' is the name of a simulated replica"),
])
def test_a_replica_or_setting_that_cannot_run_is_refused_naming_its_field(doc, field, says):
    with pytest.raises(FleetConfigError) as e:
        parse_fleet(doc, "f.yaml")
    assert str(e.value).startswith(f"f.yaml: {field}") and says in str(e.value)


def test_what_can_run_still_loads():
    parse_fleet(_ep(gpu="RTX-4090", price_per_hour=0.7))  # a GPU without a profile, priced by hand
    parse_fleet(_ep(url="https://engine.example:8443/vllm/", engine="vllm"))  # a base path behind a proxy
    parse_fleet({**_ep(name="h100-sxm-2"), **_sim(count=2)})  # not one of h100-sxm-0, h100-sxm-1
    parse_fleet(_ep(gpu="h100"))  # priced from the profile (aliases as ever)
    parse_fleet(_sim(model="llama-3.1-70b", gpu="H200", tp=2, count=3))
    parse_fleet(_sim(tp=16))  # 32 heads over 16 GPUs, the 8 KV heads each replicated twice
    parse_fleet(_sim(model="gemma-3-270m", tp=4))


def test_a_port_flag_outside_the_tcp_range_is_refused():
    cfg = parse_fleet(_ep())
    assert with_gateway(cfg, port=0).gateway.port == 0
    with pytest.raises(FleetConfigError, match="--port must be 0 to 65535"):
        with_gateway(cfg, port=70000)  # the socket layer would have bound 70000 - 65536


def test_the_engine_model_splits_heads_as_vllm_does():
    llama, qwen = model_profile("llama-3.1-8b"), model_profile("qwen2.5-7b")
    for tp in (1, 2, 4, 8, 16):
        check_tensor_parallel(llama, tp)
    for model, tp in ((llama, 3), (llama, 6), (qwen, 8), (llama, 0), (llama, True)):
        with pytest.raises(ValueError):
            check_tensor_parallel(model, tp)
    with pytest.raises(ValueError, match="attention heads"):  # engine-sim and the twin build replicas through it
        EngineModel(gpu_profile("H100"), llama, EngineSettings(tensor_parallel=3))


def _settings_classes():
    import dataclasses

    from steersman.config import DEFAULTS

    return [getattr(DEFAULTS, f.name) for f in dataclasses.fields(DEFAULTS)]


def test_every_numeric_default_is_inside_its_bounds_and_every_bound_is_enforced():
    """Each numeric setting refuses a value just outside its bounds (>= 0 when it declares none) and a NaN,
    naming itself; so a fleet file or flag cannot set a negative timeout, a zero scrape interval, a share > 1."""
    import dataclasses
    import math

    from steersman.config._base import _bounds, check_bounds

    checked = 0
    for obj in _settings_classes():
        check_bounds(obj)  # the defaults themselves
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            numeric = f.type in ("int", "float", "int | None", "float | None")
            if not numeric or isinstance(v, bool):
                continue
            ge, gt, le, lt = (None if isinstance(b, str) else b for b in _bounds(f))  # another field's: apart
            integer = f.type.startswith("int")
            bad = [gt if gt is not None else ge - 1] if (ge, gt) != (None, None) else []
            if le is not None:
                bad.append(le + 1)
            if lt is not None:
                bad.append(lt)
            if not integer:
                bad.append(math.nan)
            for b in bad:
                with pytest.raises(ValueError, match=rf"^{f.name} must be"):
                    dataclasses.replace(obj, **{f.name: int(b) if integer and b == b else b})
            checked += 1
    assert checked > 100


def test_simulated_replicas_are_started_under_the_names_checked():
    import asyncio

    from steersman.fleet.config import sim_replica_names
    from steersman.fleet.embedded import SimulatedFleet

    cfg = parse_fleet({"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "count": 2},
                                                  {"gpu": "A100", "model": "llama-3.1-8b", "pool": "cheap"},
                                                  {"gpu": "H100", "model": "qwen2.5-7b"}]}}).simulated
    names = [n for n, _ in sim_replica_names(cfg)]
    assert names == ["h100-sxm-0", "h100-sxm-1", "cheap-0", "h100-sxm-2"]
    spawned = []

    async def spawn(name, spec, gpu, model):
        spawned.append(name)
        return name

    fleet = SimulatedFleet(cfg)
    fleet._spawn = spawn  # no processes: the names it would start them under
    assert asyncio.run(fleet.start()) == names == spawned


def test_a_fleet_file_with_an_empty_simulated_fleet_is_refused(tmp_path):
    # the gateway started with no replica at all and failed deep in its set-up ("n_replicas must be >= 1")
    f = tmp_path / "fleet.yaml"
    f.write_text("simulated: {replicas: []}\n")
    with pytest.raises(FleetConfigError, match=r"fleet.yaml: simulated.replicas must list at least one replica"):
        load_fleet(f)
    f.write_text("endpoints: [{url: 'http://127.0.0.1:1', models: [m]}]\nsimulated: {replicas: []}\n")
    with pytest.raises(FleetConfigError, match=r"simulated.replicas"):
        load_fleet(f)
    parse_fleet({"simulated": {"replicas": []}})  # what `steersman plan` checks a base fleet's settings with
