"""The scheduler live: gateway + engine-sim replicas over real HTTP."""

import threading
import time

import httpx
import pytest

from steersman.config import EngineSettings
from steersman.enginesim.app import SimServerConfig
from steersman.engines.promtext import read_samples
from steersman.testing import LiveFleet, tenants_with_keys

SYSTEM = "You are the support assistant of a large retailer. " + " ".join(f"Policy {i}: returns within {i} days." for i in range(300))


def _hits(url: str) -> float:
    return read_samples(httpx.get(url + "/metrics").text, {"vllm:prefix_cache_hits_total": "h"}).get("h", 0.0)


def test_shared_prefix_lands_on_the_replica_holding_it():
    sims = [SimServerConfig(speedup=50.0, port=0) for _ in range(3)]
    with LiveFleet(sims=sims) as lf:
        body = lambda q: {"model": "llama-3.1-8b", "max_tokens": 4, "messages": [  # noqa: E731
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]}
        assert httpx.post(lf.url + "/v1/chat/completions", json=body("first question"), timeout=30).status_code == 200
        for i in range(6):
            r = httpx.post(lf.url + "/v1/chat/completions", json=body(f"question number {i}"), timeout=30)
            assert r.status_code == 200
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 1500
        hits = [_hits(s.url) for s in lf.sims]
        holder = max(range(3), key=lambda i: hits[i])
        assert hits[holder] > 6 * 1500 and sum(hits) == hits[holder], hits
        # the default profile predicts each request's SLO: all 7 were routed predicted to meet it
        g = httpx.get(lf.url + "/metrics").text
        met = [float(x.rsplit(" ", 1)[1]) for x in g.splitlines()
               if x.startswith("steersman:routes_total{") and 'slo_prediction="met"' in x]
        assert met == [7.0] and 'slo_prediction="missed"' not in g, g


def test_auth_rate_limit_and_bad_headers():
    keys, extra = tenants_with_keys({"small": {"priority": "standard", "requests_per_minute": 2}, "big": {"priority": "critical"}})
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], extra=extra) as lf:
        url = lf.url + "/v1/chat/completions"
        body = {"model": "llama-3.1-8b", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(url, json=body)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.post(url, json=body, headers={"Authorization": "Bearer sk-steersman-nope"})
        assert r.status_code == 401
        small = {"Authorization": f"Bearer {keys['small']}"}
        assert [httpx.post(url, json=body, headers=small).status_code for _ in range(2)] == [200, 200]
        r = httpx.post(url, json=body, headers=small)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
        big = {"Authorization": f"Bearer {keys['big']}"}
        assert httpx.post(url, json=body, headers=big).status_code == 200  # one tenant's limit is not another's
        for h, v in (("x-steersman-slo", "ludicrous"), ("x-steersman-deadline-ms", "-3"), ("x-steersman-workflow-step", "0")):
            r = httpx.post(url, json=body, headers={**big, h: v, "x-steersman-workflow-id": "w1"})
            assert r.status_code == 400 and r.json()["error"]["param"] == h, (h, r.text)


def test_infeasible_deadline_is_rejected_at_once():
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)]) as lf:
        body = {"model": "llama-3.1-8b", "max_tokens": 500, "messages": [{"role": "user", "content": SYSTEM}]}
        t0 = time.monotonic()
        r = httpx.post(lf.url + "/v1/chat/completions", json=body, headers={"x-steersman-deadline-ms": "20"})
        # the request alone needs longer than 20 ms on an idle engine: a 400 naming the header, not a 503 to retry
        err = r.json()["error"]
        assert r.status_code == 400 and (err["code"], err["param"], err["type"]) == (
            "deadline_infeasible", "x-steersman-deadline-ms", "invalid_request_error"), r.text
        assert "Retry-After" not in r.headers
        # a window that passes before the request could even be scheduled: the same (was a 503, which SDKs retry)
        r = httpx.post(lf.url + "/v1/chat/completions", json=body, headers={"x-steersman-deadline-ms": "0.0001"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "x-steersman-deadline-ms", r.text
        assert time.monotonic() - t0 < 1.0
        r = httpx.post(lf.url + "/v1/chat/completions", json=body, headers={"x-steersman-deadline-ms": "600000"}, timeout=60)
        assert r.status_code == 200


def test_saturated_fleet_queues_then_sheds_lowest_class_first():
    keys, extra = tenants_with_keys({t: {"priority": t} for t in ("critical", "standard", "sheddable", "batch")})
    extra["scheduler"] = {"saturation_queue_depth": 0}  # saturated once a request waits in the engine (GIE: > depth)
    extra["admission"] = {"queue_max_entries": 2}
    with LiveFleet(sims=[SimServerConfig(speedup=20.0, port=0, engine=EngineSettings(max_num_seqs=1))], extra=extra) as lf:
        url = lf.url + "/v1/chat/completions"
        engine = lf.sims[0].url
        results: dict[str, tuple[int, float]] = {}

        def send(name: str, tenant: str) -> None:
            body = {"model": "llama-3.1-8b", "max_tokens": 20, "ignore_eos": True, "messages": [{"role": "user", "content": name}]}
            r = httpx.post(url, json=body, headers={"Authorization": f"Bearer {keys[tenant]}"}, timeout=60)
            results[name] = (r.status_code, time.monotonic())

        threads = []

        def start(name, tenant):
            threads.append(threading.Thread(target=send, args=(name, tenant)))
            threads[-1].start()

        def until(cond, what):
            deadline = time.monotonic() + 10
            while not cond() and time.monotonic() < deadline:
                time.sleep(0.005)
            assert cond(), what

        # the engine makes no progress: what reaches it stays there, and the gateway sees it waiting
        assert httpx.post(engine + "/admin/faults", json={"hang": True}).status_code == 200
        start("first", "standard")
        until(lambda: lf.sims[0].engine.state().num_waiting == 1, "it reaches the engine")
        until(lambda: lf.gateway.fleet.snapshot().waiting[0] >= 1, "the gateway scraped the engine's queue")
        start("batch-1", "batch")
        until(lambda: lf.gateway.plane.waiting == 1, "batch-1 waits in the gateway")
        start("sheddable-1", "sheddable")
        until(lambda: lf.gateway.plane.waiting == 2, "sheddable-1 waits in the gateway")
        start("standard-1", "standard")  # queue full: batch-1 is shed
        until(lambda: "batch-1" in results, "batch-1 shed")
        start("critical-1", "critical")  # queue full: sheddable-1 is shed
        until(lambda: "sheddable-1" in results, "sheddable-1 shed")
        start("batch-2", "batch")  # the least important newcomer itself is refused
        until(lambda: "batch-2" in results, "batch-2 refused")
        assert httpx.delete(engine + "/admin/faults").status_code == 200  # capacity comes back
        for th in threads:
            th.join(60)
        status = {k: v[0] for k, v in results.items()}
        assert status == {"first": 200, "batch-1": 503, "sheddable-1": 503,
                          "standard-1": 200, "critical-1": 200, "batch-2": 503}, status
        assert results["critical-1"][1] < results["standard-1"][1]  # critical left the queue first


def test_a_sheddable_request_no_replica_can_serve_in_time_is_refused_early_in_openai_format():
    """scheduler.shed_infeasible (default: 'sheddable'): no replica is predicted to give a 2,400-token prompt its
    first token within 1 ms, so a sheddable tenant's request gets 503 slo_infeasible with Retry-After at once;
    a standard tenant's request runs (late); with a budget that can be met the sheddable one runs too."""
    import openai

    keys, extra = tenants_with_keys({"spare": {"priority": "sheddable"}, "std": {"priority": "standard"}})
    extra["scheduler"] = {"slo_classes": {"standard": {"ttft_s": 2.0, "tpot_s": 0.2},
                                          "instant": {"ttft_s": 0.001, "tpot_s": 0.2}}}
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0) for _ in range(2)], extra=extra) as lf:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
        instant = {"x-steersman-slo": "instant"}
        spare = openai.OpenAI(base_url=lf.url + "/v1", api_key=keys["spare"], max_retries=0)
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as e:
            spare.chat.completions.create(model="llama-3.1-8b", messages=messages, max_tokens=4, extra_headers=instant)
        assert time.monotonic() - t0 < 1.0
        err = e.value
        assert err.status_code == 503 and err.body["code"] == "slo_infeasible", err.body
        assert "first token in" in err.body["message"] and "sheddable" in err.body["message"]
        assert int(err.response.headers["Retry-After"]) >= 1
        ok = spare.chat.completions.create(model="llama-3.1-8b", messages=messages, max_tokens=4)
        assert ok.choices[0].message.content
        std = openai.OpenAI(base_url=lf.url + "/v1", api_key=keys["std"], max_retries=0)
        late = std.chat.completions.create(model="llama-3.1-8b", messages=messages, max_tokens=4, extra_headers=instant)
        assert late.usage.completion_tokens == 4
