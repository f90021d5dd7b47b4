"""Brown-out live: with the fleet saturated, sheddable traffic moves to the cheaper model, or is refused with Retry-After."""

import threading

import httpx

from conftest import SPEEDUP, fault, until
from steersman.config import EngineSettings
from steersman.control import generate_key
from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet

BIG, SMALL = "llama-3.1-8b", "qwen2.5-7b"


def _fleet(mapping):
    keys, entries = {}, []
    for t in ("std", "cheap"):
        k, digest = generate_key()
        keys[t] = k
        entries.append({"sha256": digest, "tenant": t})
    extra = {"tenants": {"std": {"priority": "standard"}, "cheap": {"priority": "sheddable"}}, "api_keys": entries,
             "scheduler": {"saturation_queue_depth": 0}, "reliability": {"brownout_queue_depth": 1, "brownout_models": mapping}}
    sims = [SimServerConfig(speedup=SPEEDUP, port=0, engine=EngineSettings(max_num_seqs=1)),
            SimServerConfig(model=SMALL, speedup=SPEEDUP, port=0)]
    return LiveFleet(sims=sims, extra=extra), keys


def _post(lf, key, model, text):
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    return httpx.post(lf.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _saturate(lf, keys, threads):
    """The big model's only replica hangs with one request in it, one more waits in the gateway queue."""
    fault(lf.sims[0].url, hang=True)
    for text in ("in the engine", "in the queue"):
        threads.append(threading.Thread(target=_post, args=(lf, keys["std"], BIG, text)))
        threads[-1].start()
        if text == "in the engine":
            until(lambda: lf.gateway.fleet.snapshot().waiting[0] >= 1, "the gateway saw the engine's queue")
    until(lambda: lf.gateway.plane.waiting >= 1, "a request waits in the gateway")


def test_brownout_moves_sheddable_traffic_to_the_cheaper_model_and_spares_the_rest():
    lf, keys = _fleet({BIG: SMALL})
    threads = []
    with lf:
        _saturate(lf, keys, threads)
        r = _post(lf, keys["cheap"], BIG, "sheddable, in a brown-out")
        assert r.status_code == 200 and r.json()["model"] == SMALL, r.text
        fault(lf.sims[0].url)
        for th in threads:
            th.join(30)
        r = _post(lf, keys["cheap"], BIG, "sheddable, fleet calm again")  # no brown-out: served as asked
        assert r.status_code == 200 and r.json()["model"] == BIG


def test_brownout_without_a_cheaper_model_refuses_sheddable_traffic_with_retry_after():
    lf, keys = _fleet({})
    threads = []
    with lf:
        _saturate(lf, keys, threads)
        r = _post(lf, keys["cheap"], BIG, "sheddable, in a brown-out")
        assert r.status_code == 503 and r.json()["error"]["code"] == "brownout" and int(r.headers["Retry-After"]) >= 1
        fault(lf.sims[0].url)
        for th in threads:
            th.join(30)
