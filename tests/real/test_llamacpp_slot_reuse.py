"""What the gateway assumes of llama-server's prompt cache, pinned against the real engine.

``LlamaCppAdapter.shares_prefill_in_flight`` is False: the prefix index credits a llama.cpp replica with
a prompt only when its request has ended.  That is what llama-server (llama-cpp-python 0.3.36) does: a
slot's prompt is reused by a later request only once the slot is free.  A request sharing the prompt
that arrives while the holder is still decoding takes another slot and prefills everything again.  If a
newer llama.cpp shares prompts across busy slots, the first test fails and the adapter should credit
at the first token (or at dispatch) instead.

One way around a busy slot exists: whenever a request starts, llama-server saves every idle slot's
prompt to its host prompt cache (``--cache-idle-slots``, on by default), and a request that finds no
free slot holding its prompt loads it from there.  The gateway's slot mirror models this
(``steersman.fleet.slots``); the last test pins it.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from realhelpers import MODEL, start_fleet, stop_fleet

pytestmark = pytest.mark.timeout(180)

PREFIX = "You are the support assistant of Acme Tools. " + " ".join(
    f"Rule {i}: parcels of weight class {i} ship from dock {i % 7} after inspection by the courier." for i in range(20)
)


@pytest.fixture(scope="module")
def engine():
    f = start_fleet(1)
    try:
        yield f
    finally:
        stop_fleet(f)


@pytest.fixture(scope="module")
def url(engine):
    return engine.endpoints()[0]["url"]


def _body(question: str, max_tokens: int, stream: bool) -> dict:
    return {"model": MODEL, "stream": stream, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "system", "content": PREFIX}, {"role": "user", "content": question}]}


def _post(url: str, body: dict) -> httpx.Response:
    """On a connection of its own: llama-server closes a connection after a streamed response and an idle one
    after 5 s, and a pooled POST that meets such a connection fails (httpx does not send a POST again)."""
    with httpx.Client(timeout=120) as c:
        return c.post(url + "/v1/chat/completions", json=body)


def _timings(url: str, question: str) -> dict:
    """llama-server's own account of one whole request: ``prompt_n`` computed, ``cache_n`` reused."""
    r = _post(url, _body(question, 2, False))
    r.raise_for_status()
    return r.json()["timings"]


def _stream_in_background(url: str, body: dict) -> tuple[threading.Event, threading.Event, threading.Thread]:
    """Stream ``body`` on a thread: (set at its first token, set when it ended, the thread)."""
    first_token, done = threading.Event(), threading.Event()

    def run() -> None:
        with httpx.Client(timeout=120) as c, c.stream("POST", url + "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if '"content":"' in line:
                    first_token.set()
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return first_token, done, t


def test_a_follower_reuses_nothing_while_the_holder_decodes_and_everything_once_it_ended(url):
    first_token, holder_done, t = _stream_in_background(url, _body("Question 1: where is my order?", 40, True))
    assert first_token.wait(60), "the holder streamed no token"
    during = _timings(url, "Question 2: may I return it?")
    assert not holder_done.is_set(), "the holder ended before the follower ran: make it decode longer"
    t.join(120)
    assert holder_done.is_set()
    after = _timings(url, "Question 3: who pays the courier?")
    prompt = during["prompt_n"] + during["cache_n"]
    assert prompt > 250
    assert during["cache_n"] < 0.2 * prompt, f"a follower reused {during['cache_n']} of {prompt} tokens from a busy slot"
    assert after["cache_n"] > 0.8 * prompt, f"after the holder ended only {after['cache_n']} of {prompt} tokens were reused"


def test_the_gateway_credits_the_replica_once_the_request_ended(engine):
    """The same through the gateway's accounting: no credit at the first token, the whole prompt at the end."""
    from steersman.testing import LiveFleet

    with LiveFleet(endpoints=engine.endpoints(), policy="steersman") as lf, httpx.Client(timeout=120) as c:
        gw = lf.gateway
        index = gw.fleet.prefix
        seen_at_first: list[int] = []
        with c.stream("POST", lf.url + "/v1/chat/completions", json=_body("Question 4: a refund?", 8, True),
                      headers={"x-steersman-slo": "batch"}) as r:
            for line in r.iter_lines():
                if '"content":"' in line and not seen_at_first:
                    seen_at_first.append(int(index.blocks_per_replica()[0]))
        deadline = time.monotonic() + 5
        while index.blocks_per_replica()[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the gateway settles the request just after the client read [DONE]
        assert seen_at_first == [0]
        assert index.blocks_per_replica()[0] >= 250 // 16


OTHER = "You translate shipping notices into plain English. " + " ".join(
    f"Term {i}: a notice of class {i} means the parcel waits at hub {i % 5} for customs." for i in range(20)
)
PREFIX2 = "You are the billing assistant of Acme Tools. " + " ".join(
    f"Clause {i}: invoices of tier {i} are due {i + 10} days after dispatch from warehouse {i % 4}." for i in range(20)
)


def _ask(url: str, system: str, question: str) -> dict:
    r = _post(url, {**_body(question, 2, False), "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question}]})
    r.raise_for_status()
    return r.json()["timings"]


def test_an_idle_slots_prompt_saved_when_another_request_starts_serves_a_follower_beside_a_busy_copy(url):
    _ask(url, PREFIX2, "Question 5: when is my invoice due?")  # PREFIX2 now sits in an idle slot
    _ask(url, OTHER, "Question 6: what does class 3 mean?")  # starting, it saves the idle slots' prompts
    body = {**_body("Question 7: can I pay later?", 40, True),
            "messages": [{"role": "system", "content": PREFIX2}, {"role": "user", "content": "Question 7: can I pay later?"}]}
    first_token, done, t = _stream_in_background(url, body)
    assert first_token.wait(60), "the first follower streamed no token"
    second = _ask(url, PREFIX2, "Question 8: is there a discount?")
    assert not done.is_set(), "the first follower ended before the second ran: make it decode longer"
    t.join(120)
    prompt = second["prompt_n"] + second["cache_n"]
    assert prompt > 250
    assert second["cache_n"] > 0.8 * prompt, f"the second follower reused only {second['cache_n']} of {prompt} tokens"
