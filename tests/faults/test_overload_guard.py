"""The gateway's overload guard (gateway.overload_loop_lag_s): a saturated gateway refuses new work, critical excepted."""

import httpx
import openai
import pytest

from steersman.control import generate_key
from steersman.enginesim.app import SimServerConfig
from steersman.fleet.config import FleetConfigError, parse_fleet
from steersman.obs.histogram import FastHistogram
from steersman.obs.looplag import LAG_BUCKETS, WINDOW, LoopLag
from steersman.pipeline.overload import gateway_overloaded
from steersman.policy.request import PriorityClass
from steersman.testing import LiveFleet

MODEL = "llama-3.1-8b"


def test_the_rule_spares_critical_and_needs_a_threshold():
    for p in PriorityClass:
        assert gateway_overloaded(p, 0.2, 0.1) == (p != PriorityClass.CRITICAL)
        assert not gateway_overloaded(p, 0.2, None)  # off by default
        assert not gateway_overloaded(p, 0.099, 0.1)
    assert gateway_overloaded(PriorityClass.STANDARD, 0.1, 0.1)


def test_sustained_lag_is_the_least_of_a_full_window():
    lag = LoopLag(FastHistogram(LAG_BUCKETS), 0.1)
    for _ in range(WINDOW - 1):
        lag.record(1.0)
    assert lag.sustained == 0.0  # not yet a whole window: no verdict
    lag.record(0.3)
    assert lag.sustained == 0.3
    lag.record(0.0)  # one sample on time: not saturated throughout
    assert lag.sustained == 0.0


def test_a_non_positive_threshold_is_refused_naming_the_field():
    fleet = {"endpoints": [{"url": "http://127.0.0.1:9", "models": [MODEL]}]}
    with pytest.raises(FleetConfigError, match="overload_loop_lag_s"):
        parse_fleet({**fleet, "gateway": {"overload_loop_lag_s": 0}}, "test")
    assert parse_fleet(fleet, "test").gateway.overload_loop_lag_s is None  # off by default


def _lagging(lf: LiveFleet, seconds: float) -> None:
    async def f():
        for _ in range(WINDOW):
            lf.gateway.metrics.loop_lag.record(seconds)

    lf.call(f)


def test_a_saturated_gateway_refuses_new_work_but_critical_and_recovers():
    keys, entries = {}, []
    for t in ("std", "vip"):
        k, digest = generate_key()
        keys[t] = k
        entries.append({"sha256": digest, "tenant": t})
    extra = {"tenants": {"std": {"priority": "standard"}, "vip": {"priority": "critical"}}, "api_keys": entries}
    # the loop's own samples come an hour apart: the test sets what the guard reads
    gw = {"overload_loop_lag_s": 0.05, "loop_lag_interval_s": 3600.0}
    with LiveFleet(sims=[SimServerConfig(gpu="H100", model=MODEL, speedup=50.0, port=0)], gateway=gw, extra=extra) as lf:
        std = openai.OpenAI(base_url=lf.url + "/v1", api_key=keys["std"], max_retries=0, timeout=30)
        vip = openai.OpenAI(base_url=lf.url + "/v1", api_key=keys["vip"], max_retries=0, timeout=30)
        ask = dict(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert std.chat.completions.create(**ask).choices[0].message.content  # calm: served

        _lagging(lf, 0.2)  # 200 ms late on every sample of the window
        with pytest.raises(openai.APIStatusError) as e:
            std.chat.completions.create(**ask)
        assert e.value.status_code == 503
        err = e.value.response.json()["error"]
        assert err["code"] == "gateway_overloaded" and "overloaded" in err["message"] and err["type"] == "server_error"
        assert int(e.value.response.headers["Retry-After"]) >= 1
        assert vip.chat.completions.create(**ask).choices[0].message.content  # critical still served

        _lagging(lf, 0.0)  # the loop keeps time again
        assert std.chat.completions.create(**ask).choices[0].message.content
        text = httpx.get(lf.url + "/metrics", timeout=10).text
        assert f'steersman_overload_refused_total{{model="{MODEL}"}} 1.0' in text
        std.close()
        vip.close()
