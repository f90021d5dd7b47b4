"""The scheduler live: gateway + engine-sim replicas over real HTTP."""

import threading
import time

import httpx
import pytest

from steersman.config import EngineSettings
from steersman.control import generate_key
from steersman.enginesim.app import SimServerConfig
from steersman.engines.promtext import read_samples
from steersman.testing import LiveFleet

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


def _keyed(tenants: dict) -> tuple[dict, dict]:
    keys, entries = {}, []
    for name in tenants:
        k, digest = generate_key()
        keys[name] = k
        entries.append({"sha256": digest, "tenant": name})
    return keys, {"tenants": tenants, "api_keys": entries}


def test_auth_rate_limit_and_bad_headers():
    keys, extra = _keyed({"small": {"priority": "standard", "requests_per_minute": 2}, "big": {"priority": "critical"}})
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
        assert r.status_code == 503 and r.json()["error"]["code"] == "deadline_infeasible"
        assert time.monotonic() - t0 < 1.0
        r = httpx.post(lf.url + "/v1/chat/completions", json=body, headers={"x-steersman-deadline-ms": "600000"}, timeout=60)
        assert r.status_code == 200


def test_saturated_fleet_queues_then_sheds_lowest_class_first():
    keys, extra = _keyed({t: {"priority": t} for t in ("critical", "standard", "sheddable", "batch")})
    extra["scheduler"] = {"saturation_queue_depth": 1}
    extra["admission"] = {"queue_max_entries": 2}
    one_slot = EngineSettings(max_num_seqs=1)
    with LiveFleet(sims=[SimServerConfig(speedup=1.0, port=0, engine=one_slot)], extra=extra) as lf:
        url = lf.url + "/v1/chat/completions"
        results: dict[str, tuple[int, float]] = {}

        def send(name: str, tenant: str, tokens: int) -> None:
            body = {"model": "llama-3.1-8b", "max_tokens": tokens, "ignore_eos": True,
                    "messages": [{"role": "user", "content": name}]}
            r = httpx.post(url, json=body, headers={"Authorization": f"Bearer {keys[tenant]}"}, timeout=60)
            results[name] = (r.status_code, time.monotonic())

        def start(name, tenant, tokens=40):
            th = threading.Thread(target=send, args=(name, tenant, tokens))
            th.start()
            return th

        def queued(n):
            deadline = time.monotonic() + 10
            while lf.gateway.plane.waiting != n and time.monotonic() < deadline:
                time.sleep(0.005)
            assert lf.gateway.plane.waiting == n

        def answered(name):
            deadline = time.monotonic() + 10
            while name not in results and time.monotonic() < deadline:
                time.sleep(0.005)
            assert name in results, name

        eng = lf.sims[0].engine

        def on_engine(running, waiting):
            deadline = time.monotonic() + 10
            while (eng.state().num_running, eng.state().num_waiting) != (running, waiting) and time.monotonic() < deadline:
                time.sleep(0.005)

        threads = [start("running", "standard", 250)]
        on_engine(1, 0)
        threads.append(start("engine-waiting", "standard", 10))
        on_engine(1, 1)  # one runs, one waits on the engine: the fleet is saturated
        threads.append(start("batch-1", "batch"))
        queued(1)
        threads.append(start("sheddable-1", "sheddable"))
        queued(2)
        threads.append(start("standard-1", "standard"))  # queue full: batch-1 is shed
        answered("batch-1")
        threads.append(start("critical-1", "critical"))  # queue full: sheddable-1 is shed
        answered("sheddable-1")
        threads.append(start("batch-2", "batch"))  # the least important newcomer itself is refused
        answered("batch-2")
        assert "running" not in results, "the test needs the engine busy until here; make 'running' longer"
        for th in threads:
            th.join(60)
        status = {k: v[0] for k, v in results.items()}
        assert status == {"running": 200, "engine-waiting": 200, "batch-1": 503, "sheddable-1": 503,
                          "standard-1": 200, "critical-1": 200, "batch-2": 503}, status
        assert results["critical-1"][1] < results["standard-1"][1]  # critical left the queue first
