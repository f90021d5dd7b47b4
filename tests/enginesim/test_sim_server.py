"""engine-sim over real HTTP: OpenAI/vLLM response shapes, metrics names, faults."""

import asyncio

import httpx
import orjson
import pytest

from steersman.enginesim.faults import FaultSpec
from steersman.engines.promtext import read_samples

CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Say something about GPUs."}]}


def sse_events(body: bytes) -> list:
    out = []
    for block in body.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[6:]
            out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


def test_chat_stream_has_vllm_shape(sim):
    url = sim.sims[0].url
    body = dict(CHAT, stream=True, max_tokens=12, ignore_eos=True, stream_options={"include_usage": True})
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    ev = sse_events(r.content)
    assert ev[-1] == "[DONE]"
    chunks = ev[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == 12
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == 12
    # the same request without streaming gives the same text (deterministic engine)
    r2 = httpx.post(url + "/v1/chat/completions", json=dict(CHAT, max_tokens=12, ignore_eos=True), timeout=30).json()
    text = "".join(c["choices"][0]["delta"]["content"] for c in content)
    assert r2["choices"][0]["message"]["content"] == text
    assert r2["usage"]["prompt_tokens"] == usage["prompt_tokens"]
    # the second identical prompt hit the prefix cache
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_completions_and_models(sim):
    url = sim.sims[0].url
    r = httpx.post(url + "/v1/completions", json={"model": "llama-3.1-8b", "prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True}, timeout=30).json()
    assert r["object"] == "text_completion" and r["usage"]["completion_tokens"] == 5 and r["choices"][0]["text"]
    models = httpx.get(url + "/v1/models").json()
    assert models["data"][0]["id"] == "llama-3.1-8b" and models["data"][0]["max_model_len"] > 0
    assert httpx.get(url + "/health").status_code == 200


def test_completions_echo_the_prompt_first_like_vllm(sim):
    url = sim.sims[0].url
    body = {"model": "llama-3.1-8b", "prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True}
    plain = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]["text"]
    r = httpx.post(url + "/v1/completions", json=dict(body, echo=True)).json()
    assert r["choices"][0]["text"] == "Once upon a time" + plain and r["usage"]["completion_tokens"] == 5
    events = sse_events(httpx.post(url + "/v1/completions", json=dict(body, prompt=["Once upon a time"], echo=True,
                                                                      stream=True)).content)
    texts = [e["choices"][0]["text"] for e in events if e != "[DONE]"]
    assert texts[0] == "Once upon a time" and "".join(texts[1:]) == plain and len(texts) == 6
    for extra, says in (({"prompt": [1, 2, 3]}, "token ids"), ({"logprobs": 1}, "logprobs")):
        r = httpx.post(url + "/v1/completions", json=dict(body, echo=True, **extra))
        assert r.status_code == 400 and r.json()["error"]["param"] == "echo" and says in r.json()["error"]["message"]


def test_metrics_use_vllm_names(sim):
    url = sim.sims[0].url
    httpx.post(url + "/v1/chat/completions", json=dict(CHAT, max_tokens=4), timeout=30)
    text = httpx.get(url + "/metrics").text
    for name in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count", "vllm:request_success_total",
    ):
        assert name in text, name
    v = read_samples(text, {"vllm:prefix_cache_queries_total": "q", "vllm:time_to_first_token_seconds_count": "n"})
    assert v["q"] > 0 and v["n"] == 1
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(text)}  # valid exposition for any Prometheus client
    ttft = fams["vllm:time_to_first_token_seconds"]
    assert ttft.type == "histogram" and {s.labels["model_name"] for s in ttft.samples} == {"llama-3.1-8b"}
    assert fams["vllm:request_success"].samples[0].labels["finished_reason"] in ("stop", "length", "abort")


def test_engine_errors_are_openai_format(sim):
    url = sim.sims[0].url
    r = httpx.post(url + "/v1/chat/completions", json=dict(CHAT, model="nope"))
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(url + "/v1/chat/completions", json=dict(CHAT, max_tokens=10**9))
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(url + "/v1/chat/completions", json=dict(CHAT, max_tokens=200_000 - 10))
    assert r.status_code == 400
    # prompt + max_tokens over max_model_len (131,072): OpenAI's code, naming the prompt's field
    r = httpx.post(url + "/v1/chat/completions", json=dict(CHAT, max_tokens=131_000,
                                                           messages=[{"role": "user", "content": "word " * 200}]))
    err = r.json()["error"]
    assert r.status_code == 400 and (err["param"], err["code"]) == ("messages", "context_length_exceeded")  # OpenAI's
    for prompt, says in (("", "must not be empty"), ([""], "must not be empty"), ([5, -1], "got -1"),
                         ([[3, -2]], "got -2")):
        r = httpx.post(url + "/v1/completions", json={"model": "llama-3.1-8b", "prompt": prompt, "max_tokens": 2})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "prompt" and says in err["message"], (prompt, r.text)


def _set_faults(sim, **kw):
    r = httpx.post(sim.sims[0].url + "/admin/faults", json=kw)
    assert r.status_code == 200, r.text
    return r.json()


def test_fault_die_after_tokens_breaks_stream_exactly(sim):
    _set_faults(sim, die_after_tokens=5)
    body = dict(CHAT, stream=True, max_tokens=40, ignore_eos=True)
    got = []
    with pytest.raises(httpx.HTTPError):
        with httpx.stream("POST", sim.sims[0].url + "/v1/chat/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    d = orjson.loads(line[6:])
                    if d["choices"][0]["delta"].get("content"):
                        got.append(d)
    assert len(got) == 5
    with pytest.raises(httpx.ConnectError):
        httpx.get(sim.sims[0].url + "/health", timeout=2)


def test_fault_error_rate_and_validation(sim):
    _set_faults(sim, error_rate=1.0, error_status=503)
    r = httpx.post(sim.sims[0].url + "/v1/chat/completions", json=dict(CHAT, max_tokens=3))
    assert r.status_code == 503 and r.json()["error"]["code"] == "injected_fault"
    bad = httpx.post(sim.sims[0].url + "/admin/faults", json={"error_rate": 2})
    assert bad.status_code == 400
    bad = httpx.post(sim.sims[0].url + "/admin/faults", json={"explode": True})
    assert bad.status_code == 400
    assert httpx.delete(sim.sims[0].url + "/admin/faults").json()["error_rate"] == 0.0
    assert httpx.post(sim.sims[0].url + "/v1/chat/completions", json=dict(CHAT, max_tokens=3)).status_code == 200


def test_fault_hang_then_recover(sim):
    _set_faults(sim, hang=True)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(sim.sims[0].url + "/v1/chat/completions", json=dict(CHAT, max_tokens=3), timeout=0.5)
    httpx.delete(sim.sims[0].url + "/admin/faults")
    assert httpx.post(sim.sims[0].url + "/v1/chat/completions", json=dict(CHAT, max_tokens=3), timeout=30).status_code == 200


def test_fault_refuse_connections_then_listen_again(sim):
    _set_faults(sim, refuse_for_s=0.5)
    with pytest.raises(httpx.ConnectError):
        httpx.get(sim.sims[0].url + "/health", timeout=2)
    deadline = 50
    for _ in range(deadline):
        try:
            if httpx.get(sim.sims[0].url + "/health", timeout=2).status_code == 200:
                break
        except httpx.ConnectError:
            sim.call(asyncio.sleep, 0.1)
    else:
        pytest.fail("engine-sim did not listen again after refuse_for_s")


def test_fault_slowdown_stretches_model_time(sim):
    url = sim.sims[0].url

    def ttft_sum():
        return read_samples(httpx.get(url + "/metrics").text, {"vllm:e2e_request_latency_seconds_sum": "s"})["s"]

    body = dict(CHAT, max_tokens=30, ignore_eos=True)
    httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    base = ttft_sum()
    _set_faults(sim, slowdown=4.0)
    httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    slow = ttft_sum() - base
    assert 3.0 < slow / base < 5.0


def test_clearing_a_huge_slowdown_answers_the_request_stuck_under_it_at_once(sim):
    """DELETE /admin/faults wakes the step begun under the slowdown (it kept its slowed end: ~200 s of real time
    here, the whole replica silent meanwhile); and a slowdown past the cap (1e308 froze the replica) is a 400."""
    from concurrent.futures import ThreadPoolExecutor

    url, runner = sim.sims[0].url, sim.sims[0].runner
    r = httpx.post(url + "/admin/faults", json={"slowdown": 1e308})
    assert r.status_code == 400 and "slowdown" in r.json()["error"]["message"]
    _set_faults(sim, slowdown=1e6)

    async def step_under_way() -> None:
        while runner._end is None:  # (the request reached the engine and its first step sleeps)
            await asyncio.sleep(0.01)

    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(httpx.post, url + "/v1/chat/completions", json=dict(CHAT, max_tokens=3), timeout=30)
        sim.call(step_under_way, timeout=10)
        assert httpx.delete(url + "/admin/faults").status_code == 200
        r = fut.result(timeout=10)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_priority_is_refused_without_priority_scheduling_and_orders_the_queue_with_it(sim):
    """As vLLM: a non-zero `priority` is a 400 naming it unless the engine runs --scheduling-policy priority;
    with it, waiting requests are served lower priority first, whatever their arrival order."""
    import threading
    import time
    from dataclasses import replace as _replace

    from steersman.config import EngineSettings
    from steersman.enginesim.app import SimServerConfig
    from steersman.testing import LiveFleet

    r = httpx.post(sim.sims[0].url + "/v1/chat/completions", json=dict(CHAT, priority=3))
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority"
    assert "Priority scheduling is not enabled" in r.json()["error"]["message"]
    engine = _replace(EngineSettings(), scheduling_policy="priority", max_num_seqs=1)
    with LiveFleet(sims=[SimServerConfig(speedup=1.0, port=0, engine=engine)], with_gateway=False) as lf:
        url = lf.sims[0].url + "/v1/chat/completions"
        done: list[str] = []

        def post(name: str, priority: int, tokens: int) -> None:
            body = dict(CHAT, max_tokens=tokens, ignore_eos=True, priority=priority)
            assert httpx.post(url, json=body, timeout=30).status_code == 200
            done.append(name)

        first = threading.Thread(target=post, args=("running", 0, 250))  # ~2 s of decode on the only slot
        first.start()
        time.sleep(0.4)
        late = threading.Thread(target=post, args=("low", 5, 10))  # arrives first, lower priority
        late.start()
        time.sleep(0.2)
        post("high", 1, 10)
        for t in (first, late):
            t.join()
        assert done == ["running", "high", "low"]


def test_a_request_of_the_whole_context_does_not_hold_the_replica(sim):
    """An engine-sim audit: ``ignore_eos`` without ``max_tokens`` (what the context leaves, ~131k tokens) with
    ``n`` 8 was generated whole on the event loop before its first step: every other stream and /health waited
    2.1 s.  A long budget is generated in a worker thread."""
    import time

    url = sim.sims[0].url

    async def run():
        async with httpx.AsyncClient(timeout=60) as c:
            big = asyncio.create_task(c.post(url + "/v1/chat/completions",
                                             json=dict(CHAT, stream=True, ignore_eos=True, n=8)))
            worst = 0.0  # (the probes below run while it is generated: ~2 s of it)
            for _ in range(10):
                t0 = time.perf_counter()
                assert (await c.get(url + "/health")).status_code == 200
                worst = max(worst, time.perf_counter() - t0)
            big.cancel()
            return worst

    assert asyncio.run(run()) < 0.5


def test_time_per_output_token_is_observed_at_every_token_as_vllm_v1_does(sim):
    """An engine-sim audit: vllm:time_per_output_token_seconds took one sample per request (its mean), vLLM v1 one
    per output token (its inter-token latency); the request's mean is vllm:request_time_per_output_token_seconds."""
    url = sim.sims[0].url
    for _ in range(3):
        httpx.post(url + "/v1/chat/completions", json=dict(CHAT, max_tokens=20, ignore_eos=True), timeout=30)
    v = read_samples(httpx.get(url + "/metrics").text, {
        "vllm:time_per_output_token_seconds_count": "tpot", "vllm:inter_token_latency_seconds_count": "itl",
        "vllm:request_time_per_output_token_seconds_count": "per_request"})
    assert v["tpot"] == v["itl"] == 3 * 19 and v["per_request"] == 3


def test_greedy_samples_are_one_answer_as_vllms(sim):
    """An engine-sim audit: ``n`` 3 at temperature 0 gave three answers; vLLM's greedy sampling gives one, n times."""
    url = sim.sims[0].url
    texts = lambda **kw: [c["message"]["content"] for c in httpx.post(  # noqa: E731
        url + "/v1/chat/completions", json=dict(CHAT, n=3, max_tokens=8, **kw), timeout=30).json()["choices"]]
    greedy = texts(temperature=0)
    assert len(greedy) == 3 and len(set(greedy)) == 1
    assert len(set(texts())) == 3  # sampled (the default temperature): each its own
