"""The configuration audit's findings: fleet files the loader accepted and the gateway then ran wrongly (a setting
ignored, an engine counted twice, two replicas under one name, a tensor parallelism vLLM refuses), failed on at
start-up without naming the key, or answered with a traceback or an out-of-memory error; and settings whose
"allowed" column (`steersman defaults`) said otherwise than what they accept.  Each is a one-line FleetConfigError
naming the key, before anything starts."""

import dataclasses
import time
from types import SimpleNamespace

import pytest

from steersman.config import DEFAULTS, ReliabilitySettings, SchedulerSettings
from steersman.config._base import bounds_text, shown, value_ranges
from steersman.fleet.config import EndpointConfig, FleetConfigError, endpoint_name, load_fleet, make_profile, parse_fleet

_EP = {"url": "http://127.0.0.1:19290", "models": ["llama-3.1-8b"]}
_SIM = {"gpu": "H100", "model": "llama-3.1-8b"}


def _eps(*endpoints: dict, **doc) -> dict:
    return {"endpoints": [{**_EP, **ep} for ep in endpoints], **doc}


def _refused(doc: dict, field: str, *says: str) -> str:
    with pytest.raises(FleetConfigError) as e:
        parse_fleet(doc, "f.yaml")
    msg = str(e.value)
    assert msg.startswith(f"f.yaml: {field}"), msg
    assert all(s in msg for s in says), msg
    assert "\n" not in msg, msg
    return msg


# ---- 1. scheduler.profile is policy: ---------------------------------------------------------------------------

_MINE = {"mine": {"filters": ["shortlist"], "scorers": [{"type": "load-balance", "weight": 1}], "picker": "max-score"}}


def test_scheduler_profile_names_the_routing_profile_as_policy_does():
    cfg = parse_fleet(_eps({}, scheduler={"profile": "round-robin"}))
    assert cfg.policy == cfg.scheduler.profile == "round-robin"  # was: steersman, the key ignored
    cfg = parse_fleet(_eps({}, policy="least-request"))
    assert cfg.policy == cfg.scheduler.profile == "least-request"  # `steersman defaults`' field says what runs
    cfg = parse_fleet(_eps({}, policy="random", scheduler={"profile": "random"}))
    assert cfg.policy == "random"
    assert parse_fleet(_eps({})).policy == DEFAULTS.scheduler.profile
    # a custom profile, named by scheduler.profile: the gateway builds it from scheduler.profiles
    cfg = parse_fleet(_eps({}, scheduler={"profile": "mine", "profiles": _MINE}))
    assert cfg.policy == "mine" and cfg.policy in cfg.profiles
    assert make_profile(cfg.policy, cfg.profiles[cfg.policy], cfg.scheduler).name == "mine"


def test_the_gateway_runs_the_profile_scheduler_profile_names():
    from steersman.api.gateway import Gateway

    gw = Gateway(parse_fleet(_eps({}, scheduler={"profile": "mine", "profiles": _MINE})))
    assert gw.policy.name == "mine"


def test_policy_and_scheduler_profile_that_differ_are_refused_naming_both():
    _refused(_eps({}, policy="random", scheduler={"profile": "round-robin"}), "scheduler.profile",
             "'round-robin'", "policy 'random'", "differ")
    _refused(_eps({}, scheduler={"profile": "nope"}), "scheduler.profile", "unknown policy 'nope'", "round-robin")


# ---- 2. one engine listed twice ----------------------------------------------------------------------------------

@pytest.mark.parametrize("a, b", [
    ("http://127.0.0.1:19290", "http://127.0.0.1:19290/"),
    ("http://LOCALHOST:80/", "http://localhost"),
    ("https://engine.example", "https://Engine.Example:443/"),
    ("http://127.0.0.1:19291/vllm/", "http://127.0.0.1:19291/vllm"),
])
def test_one_engine_listed_twice_is_refused(a, b):
    _refused(_eps({"url": a}, {"url": b}), "endpoints[1].url", "the same engine as endpoints[0]", a)


@pytest.mark.parametrize("a, b", [
    ("http://localhost:19290", "http://127.0.0.1:19290"),  # two names: perhaps two engines behind a proxy
    ("http://127.0.0.1:19290", "https://127.0.0.1:19290"),
    ("http://127.0.0.1:19290", "http://127.0.0.1:19291"),
    ("http://127.0.0.1:19290/a", "http://127.0.0.1:19290/b"),
])
def test_different_engines_load(a, b):
    parse_fleet(_eps({"url": a}, {"url": b}))


# ---- 3. replica names collide once generated -------------------------------------------------------------------

@pytest.mark.parametrize("doc, field, says", [
    (_eps({"name": "replica-1"}, {"url": "http://127.0.0.1:19291"}), "endpoints[1].name",
     "'replica-1' (an endpoint without a name is replica-<index>) is already the name of endpoints[0]"),
    (_eps({"url": "http://127.0.0.1:19291"}, {"name": "replica-0"}), "endpoints[1].name",
     "'replica-0' (its name) is already the name of endpoints[0] (an endpoint without a name"),
    ({**_eps({}), "simulated": {"replicas": [{**_SIM, "pool": "replica"}]}}, "simulated.replicas[0]",
     "'replica-0' (a simulated replica is <pool>-<k>) is already the name of endpoints[0]"),
])
def test_replica_names_that_collide_once_generated_are_refused(doc, field, says):
    _refused(doc, field, says)


def test_generated_names_that_do_not_collide_load():
    parse_fleet(_eps({"name": "replica-0"}, {"url": "http://127.0.0.1:19291"}))  # the second is replica-1
    parse_fleet({**_eps({}), "simulated": {"replicas": [{**_SIM, "pool": "replica", "count": 1}]},
                 "endpoints": [{**_EP, "name": "a"}]})


@pytest.mark.parametrize("i, name", [(0, None), (3, None), (2, "h100-0"), (1, "")])
def test_endpoint_name_is_the_name_the_gateway_gives(i, name):
    from steersman.api.gateway import Gateway

    ep = EndpointConfig(url="http://127.0.0.1:19290", name=name, engine="openai")
    gateway = SimpleNamespace(adapters={"openai": object()})  # Gateway._replica reads the adapter from here
    assert Gateway._replica(gateway, i, ep).name == endpoint_name(i, ep)


# ---- 4. an endpoint's tp ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("ep, says", [
    ({"gpu": "H100", "tp": 1000}, "32 attention heads must be divisible by tensor_parallel (1000)"),
    ({"gpu": "H100", "tp": 3}, "32 attention heads must be divisible by tensor_parallel (3)"),
    ({"gpu": "H100", "tp": 99999999999999999999}, "a 20-digit integer"),
    ({"tp": 99999999999999999999}, "a 20-digit integer"),  # was refused at start, as tensor_parallel
    ({"gpu": "H100", "models": ["served-name"], "model_profile": "llama-3.1-8b", "tp": 6}, "tensor_parallel (6)"),
])
def test_an_endpoint_tp_vllm_would_refuse_is_refused(ep, says):
    _refused(_eps(ep), "endpoints[0].tp", says)


def test_an_endpoint_tp_that_splits_or_cannot_be_checked_loads():
    cfg = parse_fleet(_eps({"gpu": "H100", "tp": 8}))
    assert cfg.endpoints[0].tp == 8
    parse_fleet(_eps({"models": ["my-model"], "gpu": "H100", "tp": 3}))  # no profile: nothing to split
    parse_fleet(_eps({"tp": 3}))  # no GPU: not modelled


# ---- 5, 9. settings against each other; the queue's least size ------------------------------------------------

@pytest.mark.parametrize("section, values, field, says", [
    ("reliability", {"limit_min": 100, "limit_max": 10}, "reliability.limit_min", "must be <= limit_max (10), got 100"),
    ("reliability", {"limit_initial": 300}, "reliability.limit_initial", "<= limit_max (200), got 300"),
    ("reliability", {"limit_initial": 2, "limit_min": 3}, "reliability.limit_initial", ">= limit_min (3), got 2"),
    ("reliability", {"base_ejection_time_s": 400}, "reliability.base_ejection_time_s", "<= max_ejection_time_s (300)"),
    ("reliability", {"retry_base_backoff_s": 1}, "reliability.retry_base_backoff_s", "<= retry_max_backoff_s (0.25)"),
    ("admission", {"queue_max_entries": 0}, "admission.queue_max_entries", ">= 1, got 0"),
])
def test_settings_outside_each_other_are_refused_naming_both(section, values, field, says):
    _refused(_eps({}, **{section: values}), field, says)


@pytest.mark.parametrize("values, want", [
    ({"limit_max": 16}, {"limit_initial": 16.0, "limit_min": 3.0}),  # was refused: limit_initial 20, never written
    ({"limit_min": 30}, {"limit_initial": 30.0}),
    ({"max_ejection_time_s": 10}, {"base_ejection_time_s": 10.0}),
    ({"retry_max_backoff_s": 0.01}, {"retry_base_backoff_s": 0.01}),
])
def test_a_setting_left_at_its_default_follows_the_bound_the_file_sets(values, want):
    """A setting bounded by another that the file sets, left at its default outside that bound, follows it (review,
    thirty-fifth session: `limit_max: 16` alone was refused for limit_initial 20, a key the file never wrote); a
    setting the file writes outside a bound stays an error naming it (above)."""
    rel = parse_fleet(_eps({}, reliability=values)).reliability
    assert {k: getattr(rel, k) for k in want} == want


def test_a_queue_shorter_than_the_brownout_depth_is_refused_when_brownout_is_configured():
    msg = _refused(_eps({}, admission={"queue_max_entries": 10}, reliability={"brownout_queue_depth": 20}),
                   "admission.queue_max_entries", "(10) is below reliability.brownout_queue_depth (20)")
    assert "brown-out" in msg
    _refused(_eps({}, admission={"queue_max_entries": 10},
                  reliability={"brownout_models": {"llama-3.1-70b": "llama-3.1-8b"}}),
             "admission.queue_max_entries", "reliability.brownout_queue_depth (64)")
    parse_fleet(_eps({}, admission={"queue_max_entries": 20}, reliability={"brownout_queue_depth": 20}))
    parse_fleet(_eps({}, admission={"queue_max_entries": 2}))  # brown-out at its defaults: the full queue sheds


def test_the_queue_takes_what_the_setting_allows():
    from steersman.control.queue import GatewayQueue

    ge = dataclasses.fields(DEFAULTS.admission)[0].metadata["ge"]
    assert GatewayQueue(dataclasses.replace(DEFAULTS.admission, queue_max_entries=ge)).max_entries == ge


# ---- 6. bucket counts ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["breaker_buckets", "throttle_buckets"])
def test_bucket_counts_are_bounded(key):
    t0 = time.monotonic()
    _refused(_eps({}, reliability={key: 10**9}), f"reliability.{key}", "must be 1 to 1000, got 1000000000")
    assert time.monotonic() - t0 < 1.0
    assert getattr(parse_fleet(_eps({}, reliability={key: 1000})).reliability, key) == 1000


# ---- 7. a value's repr is never the message ---------------------------------------------------------------------

def _bomb() -> str:
    """A YAML anchor/alias chain of ~700 bytes: 9 levels of 9 aliases, 9**9 (387M) strings once expanded."""
    levels = ["&a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"&a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 9)]
    return f"[{', '.join(levels)}]"


@pytest.mark.parametrize("body, field", [
    ("scheduler: {profiles: {p: {queue_when_saturated: BOMB}}}", "scheduler.profiles.p.queue_when_saturated"),
    ("scheduler: {profiles: {p: {scorers: [{type: load-balance, weight: BOMB}]}}}",
     "scheduler.profiles.p.scorers[0].weight"),
    ("scheduler: {slo_classes: {standard: {ttft_s: BOMB}}}", "scheduler.slo_classes.standard.ttft_s"),
    ("tenants: {acme: {priority: BOMB}}", "tenants.acme.priority"),
    ("tenants: {acme: {requests_per_minute: BOMB}}", "tenants.acme.requests_per_minute"),
    ("tenants: {acme: {}}\napi_keys: [{sha256: '" + "a" * 64 + "', tenant: BOMB}]", "api_keys[0].tenant"),
])
def test_an_alias_chain_in_a_value_is_named_by_its_kind_at_once(tmp_path, body, field):
    f = tmp_path / "fleet.yaml"
    f.write_text("endpoints: [{url: 'http://127.0.0.1:19290', models: [m]}]\n" + body.replace("BOMB", _bomb()) + "\n")
    assert f.stat().st_size < 1000
    t0 = time.monotonic()
    with pytest.raises(FleetConfigError) as e:
        load_fleet(f)
    assert time.monotonic() - t0 < 1.0
    assert str(e.value).startswith(f"{f}: {field}") and str(e.value).endswith("got a list"), str(e.value)


@pytest.mark.parametrize("section, values, field", [
    ("scheduler", {"slo_classes": {"standard": {"ttft_s": 10**5000}}}, "scheduler.slo_classes.standard.ttft_s"),
    ("gateway", {"max_body_bytes": 10**5000}, "gateway.max_body_bytes"),
    ("tenants", {"acme": {"requests_per_minute": 10**5000}}, "tenants.acme.requests_per_minute"),
])
def test_an_integer_python_will_not_print_is_named_by_its_size(section, values, field):
    _refused(_eps({}, **{section: values}), field, "an integer of 16,610 bits")


def test_a_long_number_in_the_file_is_an_error_naming_its_line(tmp_path):
    f = tmp_path / "fleet.yaml"
    f.write_text("endpoints: [{url: 'http://127.0.0.1:19290', models: [m]}]\ngateway: {max_body_bytes: " + "9" * 5000 + "}\n")
    with pytest.raises(FleetConfigError, match=r"invalid YAML: a number of 5,000 characters on line 2"):
        load_fleet(f)  # was: ValueError (int() refuses past 4,300 digits), a traceback


def test_shown_cuts_a_long_string():
    assert shown("x" * 10_000).startswith("'" + "x" * 80 + "'...") and len(shown("x" * 10_000)) < 120
    assert shown("short") == "'short'" and shown(1.5) == "1.5" and shown({"a": 1}) == "a mapping"


# ---- 8. URLs -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("url, says", [
    ("http://[::1:19290", "IPv6"),  # was: ValueError: Invalid IPv6 URL, a traceback
    ("http://127.0.0.1:19290/v1", "give the engine's base URL, without /v1"),
    ("http://127.0.0.1:19290/v1/", "without /v1"),
    ("http://127.0.0.1:19290/?key=abc", "query string"),
    ("http://u:p@127.0.0.1:19290", "credentials"),
])
def test_an_endpoint_url_the_gateway_cannot_use_as_written_is_refused(url, says):
    _refused(_eps({"url": url}), "endpoints[0].url", says)


@pytest.mark.parametrize("key", ["response_store_url", "limits_url"])
@pytest.mark.parametrize("url, says", [
    ("redis://[::1", "IPv6"),
    ("redis://127.0.0.1:99999/14", "port that is not a number 1 to 65535"),
    ("redis://127.0.0.1:6379/abc", "not a database number"),
])
def test_a_redis_url_redis_py_would_refuse_or_misread_is_refused_naming_its_key(key, url, says):
    _refused(_eps({}, gateway={key: url}), f"gateway.{key}", says)


def test_redis_urls_redis_py_reads_as_written_load():
    for url in ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379", "redis://127.0.0.1:6379/", "rediss://c:6380/2",
                "unix:///run/redis.sock", "redis://[::1]:6379/3",
                "redis://127.0.0.1:6379/steersman?db=3", "redis://127.0.0.1:6379/%31"):  # (redis-py: db 3, db 1)
        assert parse_fleet(_eps({}, gateway={"limits_url": url})).gateway.limits_url == url


@pytest.mark.parametrize("url", ["http://[::1:4318/v1/traces", "http://127.0.0.1:99999/v1/traces", "http:///v1/traces"])
def test_an_otlp_endpoint_that_cannot_be_reached_is_refused(url):
    _refused(_eps({}, gateway={"otlp_traces_endpoint": url}), "gateway.otlp_traces_endpoint")
    _refused({"simulated": {"replicas": [_SIM], "otlp_traces_endpoint": url}}, "simulated.otlp_traces_endpoint")


# ---- 10. a simulated replica's adapter named as its model ---------------------------------------------------------

def test_a_simulated_replica_adapter_named_as_its_model_is_refused():
    _refused({"simulated": {"replicas": [{**_SIM, "lora_modules": ["sql", "llama-3.1-8b"]}]}},
             "simulated.replicas[0].lora_modules", "'llama-3.1-8b' is the model's own name")
    _refused({"simulated": {"replicas": [{**_SIM, "served_model_name": "chat", "lora_modules": ["chat"]}]}},
             "simulated.replicas[0].lora_modules", "'chat'")
    parse_fleet({"simulated": {"replicas": [{**_SIM, "served_model_name": "chat", "lora_modules": ["sql"]}]}})


# ---- 11. the allowed column is what the settings accept -----------------------------------------------------------

def _field(cls, name):
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def test_the_allowed_column_states_the_true_bounds():
    ranges = value_ranges(DEFAULTS)
    assert ranges["scheduler.kv_headroom_tie"] == ">= 0, < 1"
    assert ranges["scheduler.late_latency_tie"] == ">= 1, <= exploit_slowdown"
    assert ranges["scheduler.prefix_index_max_mib"] == ">= 0.03"
    assert ranges["reliability.limit_initial"] == ">= limit_min, <= limit_max"
    assert ranges["reliability.breaker_buckets"] == "1 to 1000"
    assert ranges["admission.queue_max_entries"] == ">= 1"
    assert "1 turns pooling off" in _field(SchedulerSettings, "unprofiled_tpot_pool_spread").metadata["source"]
    assert "<= 1 turns" not in _field(SchedulerSettings, "unprofiled_tpot_pool_spread").metadata["source"]


@pytest.mark.parametrize("name, ok, refused", [
    ("kv_headroom_tie", [0.0, 0.999], [1.0, -0.01]),
    ("late_latency_tie", [1.0, 4.0], [4.01, 0.5]),
    ("unprofiled_tpot_pool_spread", [1.0], [0.99]),
])
def test_scheduler_settings_accept_exactly_their_stated_bounds(name, ok, refused):
    for v in ok:
        dataclasses.replace(DEFAULTS.scheduler, **{name: v})
    for v in refused:  # the error says the bound the column shows
        with pytest.raises(ValueError, match=rf"^{name} must be ") as e:
            dataclasses.replace(DEFAULTS.scheduler, **{name: v})
        assert str(e.value).split(" must be ")[1].split(",")[0].split(" (")[0] in bounds_text(_field(SchedulerSettings, name))


def test_the_prefix_index_budget_is_checked_for_the_fleet_it_serves():
    from steersman.fleet.prefix_index import PrefixIndex

    PrefixIndex(1, 0.03 * 2**20)  # the stated least does for one replica
    parse_fleet(_eps({}, scheduler={"prefix_index_max_mib": 0.03}))
    _refused(_eps({}, scheduler={"prefix_index_max_mib": 0.02}), "scheduler.prefix_index_max_mib", ">= 0.03")
    many = [{"url": f"http://127.0.0.1:{19300 + i}"} for i in range(99)]
    _refused(_eps(*many, scheduler={"prefix_index_max_mib": 0.03}), "scheduler.prefix_index_max_mib",
             "at least 0.041 MiB for 99 replicas")  # was refused only by the gateway's start


def test_reliability_bounds_between_fields_hold_for_the_defaults():
    ReliabilitySettings()  # the defaults keep them
    s = dataclasses.replace(DEFAULTS.reliability, limit_min=1, limit_initial=1, limit_max=1)  # all equal: fine
    assert s.limit_initial == 1


def test_a_llamacpp_endpoint_splits_over_any_gpu_count():
    """vLLM's head-count rule is vLLM's: llama.cpp splits a model over GPUs by layers or rows (review, thirty-fifth
    session: `engine: llamacpp, tp: 3` was refused "as vLLM requires")."""
    assert parse_fleet(_eps({"engine": "llamacpp", "gpu": "L40S", "models": ["llama-3.1-8b"], "tp": 3})).endpoints[0].tp == 3
    _refused(_eps({"engine": "vllm", "gpu": "L40S", "models": ["llama-3.1-8b"], "tp": 3}), "endpoints[0].tp")


def test_the_twin_simulates_an_endpoint_under_its_model_profile_and_the_gateways_name():
    """An endpoint serving its model under another name (`model_profile`) was skipped by the twin (it looked the
    served name up as the model), and an unnamed endpoint was named by its place among the twin's plans, not the
    gateway's replica-<index> (review, thirty-fifth session)."""
    from steersman.twin.fleet import TwinFleet

    cfg = parse_fleet({"endpoints": [
        {"name": "cpu", "url": "http://127.0.0.1:1", "engine": "llamacpp"},  # no GPU: not simulated
        {"url": "http://127.0.0.1:2", "gpu": "H100", "models": ["prod-chat"], "model_profile": "llama-3.1-8b"}]})
    (plan,) = TwinFleet.from_config(cfg).plans
    assert (plan.name, plan.model, plan.served_model_name) == ("replica-1", "llama-3.1-8b", "prod-chat")


def test_a_model_browning_out_to_itself_is_refused():
    """Brown-out would shed what it was meant to move (config audit, thirty-fifth session)."""
    _refused(_eps({}, reliability={"brownout_models": {"llama-3.1-8b": "llama-3.1-8b"}}),
             "reliability.brownout_models.llama-3.1-8b", "not to itself")


def test_numbers_in_a_fleet_file_are_read_as_yaml_1_2_reads_them():
    """PyYAML reads YAML 1.1: `port: 1:30` was port 90 (base 60), `port: 010` port 8 (octal), and `1e-3` a string one
    section took and another refused (config audit, thirty-fifth session)."""
    from steersman.fleet._config_checks import load_yaml

    got = load_yaml("a: 1:30\nb: 010\nc: 1e-3\nd: 1_000\ne: 0x1F\nf: .inf\ng: yes\nh: '010'\n")
    assert got == {"a": "1:30", "b": 10, "c": 0.001, "d": 1000, "e": 31, "f": float("inf"), "g": True, "h": "010"}
    with pytest.raises(FleetConfigError, match="gateway.port"):
        parse_fleet(load_yaml("gateway: {port: 1:30}\nendpoints: [{url: 'http://127.0.0.1:1', models: [m]}]\n"))
    cfg = parse_fleet(load_yaml("scheduler: {slo_classes: {interactive: {ttft_s: 5e-1, tpot_s: 4e-2}, batch: {}}, "
                                "default_slo: batch}\nendpoints: [{url: 'http://127.0.0.1:1', models: [m]}]\n"))
    assert cfg.scheduler.slo_classes["interactive"].ttft_s == 0.5
