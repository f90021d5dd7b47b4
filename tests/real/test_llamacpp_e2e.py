"""Two real llama-server replicas (Gemma 3 270M) behind the gateway, driven by the official openai client."""

from __future__ import annotations

import time

import pytest
from openai import OpenAI

from steersman.fleet import snapshot as S
from steersman.testing import LiveFleet

from realhelpers import MODEL, counters, slots

pytestmark = pytest.mark.timeout(300)

# A long system prompt shared by "tenant" requests (~550 Gemma tokens): prefill dominates a cold TTFT.
_FACTS = [
    "Orders ship from the Rotterdam warehouse within two business days.",
    "Refunds are issued to the original payment method after inspection.",
    "Support answers in the language of the customer, politely and briefly.",
    "Warranty claims need the serial number printed under the battery cover.",
    "Never promise delivery dates for items marked as backordered.",
    "Escalate any mention of injury or fire to the safety team immediately.",
]
PREFIX = "You are the support assistant of Acme Tools. " + " ".join(
    f"Rule {i}: {_FACTS[i % len(_FACTS)]}" for i in range(36)
)


# The `batch` SLO class (no TTFT target): llama.cpp replicas on CPU have no hardware profile, so the
# default profile predicts their TTFT from what it observed there, prefix-blind; a cold ~550-token
# prefill on 1 thread of a busy 2-core box can exceed the `standard` class's 2 s TTFT target, and the
# picker would then prefer the replica it has not observed yet. Without a TTFT target every replica
# meets the SLO and the profile's scores (prefix affinity first) decide, which is what this tests.
BATCH = {"x-steersman-slo": "batch"}


def _chat(client: OpenAI, question: str, max_tokens: int = 8) -> tuple[float, str]:
    """(TTFT seconds, text) of one streamed chat completion."""
    t0 = time.perf_counter()
    ttft = None
    parts = []
    stream = client.chat.completions.create(
        model=MODEL, stream=True, max_tokens=max_tokens, temperature=0, extra_headers=BATCH,
        messages=[{"role": "system", "content": PREFIX}, {"role": "user", "content": question}],
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if ttft is None:
                ttft = time.perf_counter() - t0
            parts.append(chunk.choices[0].delta.content)
    assert ttft is not None, "no token streamed"
    return ttft, "".join(parts)


@pytest.fixture(scope="module")
def gateway(engines):
    with LiveFleet(endpoints=engines.endpoints(), policy="steersman") as lf:
        yield lf


@pytest.fixture(scope="module")
def client(gateway):
    with OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_openai_client_streams_real_tokens(client):
    stream = client.chat.completions.create(
        model=MODEL, stream=True, max_tokens=24, temperature=0,
        messages=[{"role": "user", "content": "Write one sentence about the sea."}],
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 5
    assert text.strip()
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] in (["length"], ["stop"])
    assert {m.id for m in client.models.list().data} == {MODEL}


def test_shared_prefix_goes_to_the_replica_holding_it(engines, gateway, client):
    urls = [p.url for p in engines.procs]
    before = [counters(u) for u in urls]
    _chat(client, "Question 0: where do orders ship from?")  # warms one replica with the prefix
    mid = [counters(u) for u in urls]
    touched = [i for i in range(2) if mid[i]["processed"] + mid[i]["cached"] > before[i]["processed"] + before[i]["cached"]]
    assert len(touched) == 1, f"one request must reach exactly one replica, counters {before} -> {mid}"
    warm, cold = touched[0], 1 - touched[0]
    prefix_tokens = mid[warm]["processed"] - before[warm]["processed"]  # prompt tokens it computed (cold)
    assert prefix_tokens > 400

    ttfts_warm = [_chat(client, f"Question {i}: summarise rule {i}.")[0] for i in range(1, 4)]
    after = [counters(u) for u in urls]
    assert after[cold] == mid[cold], "a request sharing the prefix went to the replica without it"
    reused = after[warm]["cached"] - mid[warm]["cached"]
    assert reused >= 3 * 0.9 * (prefix_tokens - 40), f"replica {warm} reused only {reused} cached prompt tokens"
    # /slots agrees: a slot of the warm replica holds the prefix, none of the cold one does
    assert max(s.held_tokens for s in slots(urls[warm])) >= prefix_tokens - 40
    assert max(s.held_tokens for s in slots(urls[cold])) < 0.5 * prefix_tokens

    # The same kind of request on the other replica, which does not hold the prefix: a full prefill.
    with OpenAI(base_url=urls[cold] + "/v1", api_key="unused", max_retries=0, timeout=120) as direct:
        ttft_cold, _ = _chat(direct, "Question 9: summarise rule 9.")
    assert counters(urls[cold])["cached"] - after[cold]["cached"] < 0.5 * prefix_tokens
    assert max(ttfts_warm) < ttft_cold, f"TTFT on the replica holding the prefix {ttfts_warm} vs cold {ttft_cold:.3f} s"

    # The scraper read the engines into the fleet snapshot.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        snap = gateway.gateway.fleet.snapshot()
        if snap.live[S.PREFIX_HITS, warm] >= after[warm]["cached"]:
            break
        time.sleep(0.05)
    assert snap.live[S.PREFIX_HITS, warm] >= after[warm]["cached"]
    assert snap.live[S.PREFIX_QUERIES, warm] >= after[warm]["cached"] + after[warm]["processed"]
    assert snap.live[S.KV_BLOCKS_TOTAL, warm] > 0

    # ... and learned each engine's own speed from its timing counters (what the linear model predicts with):
    # Gemma 3 270M on one CPU thread computes a prompt token in a few ms and generates one in tens of ms
    prefill, decode = snap.live[S.PREFILL_S_TOKEN, warm], snap.live[S.DECODE_S_TOKEN, warm]
    assert 1e-4 < prefill < 0.1, f"learned {prefill} s per prompt token"
    assert 1e-3 < decode < 1.0 and decode > prefill, f"learned {decode} s per generated token"


def test_a_prompt_over_the_context_is_a_400_in_openai_format(engines, gateway, client):
    """Over a slot's context (2,048 tokens: -c 8192 over 4 slots) the engine refuses in llama.cpp's shape (a numeric
    code, no param), which reaches the client in OpenAI's; over every replica's whole KV cache (8,192 tokens) the
    gateway refuses it itself, without a 503 its client would retry."""
    import openai

    for words, who in ((3000, "engine"), (9000, "gateway")):
        for kind in ("chat", "completion"):
            with pytest.raises(openai.BadRequestError) as e:
                if kind == "chat":
                    client.chat.completions.create(model=MODEL, max_tokens=4,
                                                   messages=[{"role": "user", "content": "word " * words}])
                else:
                    client.completions.create(model=MODEL, max_tokens=4, prompt="word " * words)
            err = e.value.body
            field = "messages" if kind == "chat" else "prompt"
            assert e.value.status_code == 400, (who, kind)
            assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "context_length_exceeded",
                                                               field), (who, kind, err)
            assert isinstance(err["message"], str) and ("context" in err["message"]), err


def test_a_whole_response_shows_its_replicas_work_to_the_stall_rule(engines, gateway, client):
    """A non-streamed request gives the gateway no event until it ends; the replica's scrapes read its engine's
    work counter (``llamacpp:n_decode_total``, advancing at every ``llama_decode`` call while
    ``tokens_predicted_total`` waits for the request's end) and count it as progress (``Fleet.last_output``)."""
    import threading

    gw = gateway.gateway
    box = {}

    def ask():
        box["r"] = client.chat.completions.create(
            model=MODEL, max_tokens=96, temperature=0, extra_headers=BATCH,
            messages=[{"role": "user", "content": "Write a long story about a lighthouse keeper."}])

    t0 = gw.clock.now()
    th = threading.Thread(target=ask, daemon=True)
    th.start()
    seen = None
    deadline = time.monotonic() + 120
    while th.is_alive() and time.monotonic() < deadline:
        shown = gw.fleet.last_output(gw.clock.now())
        if (shown > t0).any() and th.is_alive():
            seen = shown.copy()
            break
        time.sleep(0.02)
    th.join(120)
    assert box["r"].usage.completion_tokens > 8
    assert seen is not None, "no scrape saw the replica work before its response came"
