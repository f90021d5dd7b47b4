"""Brown-out live: with the fleet saturated, sheddable traffic moves to the cheaper model, or is refused with Retry-After."""

import threading

import httpx
from openai import OpenAI

from conftest import SPEEDUP, fault, scaled, until
from steersman.config import EngineSettings
from steersman.control import generate_key
from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet

BIG, SMALL = "llama-3.1-8b", "qwen2.5-7b"


def _fleet(mapping, rel=None):
    """The big model's replica takes one request at a time (its concurrency limit is 1: a second one waits in the
    gateway queue), the small model's one beside it."""
    keys, entries = {}, []
    for t in ("std", "cheap"):
        k, digest = generate_key()
        keys[t] = k
        entries.append({"sha256": digest, "tenant": t})
    extra = {"tenants": {"std": {"priority": "standard"}, "cheap": {"priority": "sheddable"}}, "api_keys": entries,
             "reliability": {"brownout_queue_depth": 1, "brownout_models": mapping,
                             "limit_initial": 1, "limit_min": 1, "limit_max": 1, **(rel or {})}}
    sims = [SimServerConfig(speedup=SPEEDUP, port=0, engine=EngineSettings(max_num_seqs=1)),
            SimServerConfig(model=SMALL, speedup=SPEEDUP, port=0)]
    return LiveFleet(sims=sims, extra=extra), keys


def _post(lf, key, model, text):
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    return httpx.post(lf.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _release(lf, threads):
    fault(lf.sims[0].url)
    for th in threads:
        th.join(30)


def _brownouts(lf, model: str, action: str) -> float:
    """``steersman:brownout_total{model, action}``."""
    return next(s for s in lf.gateway.pipeline.stages if s.name == "brownout").counts.get(model, action)


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
    lf, keys = _fleet({BIG: SMALL}, rel={"brownout_stabilization_s": 0})  # ends as soon as the backlog is gone
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


def test_a_conversation_stays_on_the_cheaper_model_through_the_stabilization_window():
    """The backlog that began the brown-out is gone, but the window (300 s) has not passed since it was last
    seen: the conversation's next turn still goes to the small model (one threshold sent it back to the big one
    at once, and the next backlog forward again: consecutive turns alternated models)."""
    lf, keys = _fleet({BIG: SMALL})
    threads = []
    with lf:
        _saturate(lf, keys, threads)
        r = _post(lf, keys["cheap"], BIG, "turn 1, in a brown-out")
        assert r.status_code == 200 and r.json()["model"] == SMALL, r.text
        _release(lf, threads)
        assert lf.gateway.plane.waiting_for(BIG) == 0
        r = _post(lf, keys["cheap"], BIG, "turn 2, the backlog gone")
        assert r.status_code == 200 and r.json()["model"] == SMALL and r.headers["x-steersman-served-model"] == SMALL
        r = _post(lf, keys["std"], BIG, "standard traffic is never browned out")
        assert r.status_code == 200 and r.json()["model"] == BIG
        assert _brownouts(lf, BIG, "moved") == 2


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


def test_another_models_backlog_does_not_brown_out_an_idle_model():
    """Only the big model is saturated (one request in its replica, one waiting in the gateway): sheddable traffic
    for the idle small model is served, not refused (brown-out once looked at the whole gateway queue)."""
    lf, keys = _fleet({BIG: SMALL})
    threads = []
    with lf:
        _saturate(lf, keys, threads)
        try:
            assert lf.gateway.plane.waiting_for(BIG) == 1 and lf.gateway.plane.waiting_for(SMALL) == 0
            r = _post(lf, keys["cheap"], SMALL, "sheddable, for the idle model")
            assert r.status_code == 200 and r.json()["model"] == SMALL, r.text
            assert "x-steersman-served-model" not in r.headers  # served as asked
            assert _brownouts(lf, SMALL, "shed") == 0
        finally:
            _release(lf, threads)


def test_a_cheaper_model_the_guard_took_out_is_no_target_the_request_is_shed():
    """The small model's only replica failed until the guard ejected it (still healthy to the scraper): a brown-out
    does not move sheddable traffic there (it went, by panic routing, and got the ejected engine's 502), it refuses
    it with 503 and Retry-After."""
    lf, keys = _fleet({BIG: SMALL}, rel=scaled())
    threads = []
    with lf:
        g = lf.gateway
        fault(lf.sims[1].url, error_rate=1.0)
        for i in range(8):
            _post(lf, keys["std"], SMALL, f"fail {i}")
            if g.fleet.blocked(1):
                break
        assert g.fleet.blocked(1) and g.fleet.snapshot().routable[1]
        _saturate(lf, keys, threads)
        try:
            assert g.fleet.blocked(1)
            r = _post(lf, keys["cheap"], BIG, "sheddable, in a brown-out")
            assert r.status_code == 503 and r.json()["error"]["code"] == "brownout", r.text
            assert int(r.headers["Retry-After"]) >= 1
            assert _brownouts(lf, BIG, "shed") == 1 and _brownouts(lf, BIG, "moved") == 0
        finally:
            fault(lf.sims[1].url)
            _release(lf, threads)


def test_a_move_keeps_the_body_the_parser_took_and_is_counted_once_done():
    """A forwarded field the typed parser accepts (a number out of float range) once made the move's untyped
    re-decode raise: a 500, counted as moved.  The body is rewritten in place: the answer is the small model's."""
    lf, keys = _fleet({BIG: SMALL})
    raw = b'{"model":"%b","max_tokens":4,"messages":[{"role":"user","content":"hi"}],"my_ext":1e999}' % BIG.encode()
    headers = {"Authorization": f"Bearer {keys['cheap']}", "Content-Type": "application/json"}
    threads = []
    with lf:
        r = httpx.post(lf.url + "/v1/chat/completions", content=raw, headers=headers, timeout=30)
        assert r.status_code == 200 and r.json()["model"] == BIG, r.text  # taken as it is, no brown-out
        _saturate(lf, keys, threads)
        try:
            r = httpx.post(lf.url + "/v1/chat/completions", content=raw, headers=headers, timeout=30)
            assert r.status_code == 200 and r.json()["model"] == SMALL, r.text
            assert _brownouts(lf, BIG, "moved") == 1
        finally:
            _release(lf, threads)


def test_a_moved_answer_names_the_model_that_served_it_on_every_endpoint():
    """Chat, completions and Responses (official client): the answer's model is the one that served it, and the
    ``x-steersman-served-model`` header says so; the stored Response too (it said the model asked for)."""
    lf, keys = _fleet({BIG: SMALL})
    threads = []
    with lf:
        client = OpenAI(base_url=lf.url + "/v1", api_key=keys["cheap"], max_retries=0)
        calm = client.chat.completions.with_raw_response.create(
            model=BIG, max_tokens=4, messages=[{"role": "user", "content": "calm"}])
        assert calm.parse().model == BIG and "x-steersman-served-model" not in calm.headers
        _saturate(lf, keys, threads)
        try:
            chat = client.chat.completions.with_raw_response.create(
                model=BIG, max_tokens=4, messages=[{"role": "user", "content": "moved"}])
            text = client.completions.with_raw_response.create(model=BIG, max_tokens=4, prompt="moved")
            resp = client.responses.with_raw_response.create(model=BIG, max_output_tokens=4, input="moved")
            for raw in (chat, text, resp):
                assert raw.headers["x-steersman-served-model"] == SMALL
                assert raw.parse().model == SMALL
            assert client.responses.retrieve(resp.parse().id).model == SMALL
            assert _brownouts(lf, BIG, "moved") == 3
        finally:
            client.close()
            _release(lf, threads)
