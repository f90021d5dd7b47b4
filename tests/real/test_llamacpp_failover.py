"""Kill a real llama-server mid-stream: the client's one stream goes on from the other replica."""

from __future__ import annotations

import importlib.util
import time

import pytest
from openai import OpenAI
from realhelpers import MODEL, counters, slots, start_fleet, stop_fleet

from steersman.testing import LiveFleet

pytestmark = pytest.mark.timeout(300)

MAX_TOKENS = 120
KILL_AFTER = 12


def _serving(urls: list[str]) -> int:
    busy = [i for i, u in enumerate(urls) if any(s.processing for s in slots(u))]
    assert len(busy) == 1, f"expected exactly one replica processing, got {busy}"
    return busy[0]


def test_stream_continues_on_the_other_replica_after_a_kill():
    if importlib.util.find_spec("steersman.pipeline.continuation") is None:
        pytest.xfail("mid-stream continuation (pipeline/continuation.py) has not landed")
    engines = start_fleet(2)
    try:
        urls = [p.url for p in engines.procs]
        with LiveFleet(endpoints=engines.endpoints(), policy="steersman") as lf, \
                OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
            stream = c.chat.completions.create(
                model=MODEL, stream=True, max_tokens=MAX_TOKENS, temperature=0,
                extra_body={"ignore_eos": True},  # llama-server: generate exactly max_tokens
                messages=[{"role": "user", "content": "Tell a long story about a lighthouse keeper."}],
            )
            chunks, texts, killed, before = [], [], None, None
            for ch in stream:
                chunks.append(ch)
                if ch.choices and ch.choices[0].delta.content:
                    texts.append(ch.choices[0].delta.content)
                    if len(texts) == KILL_AFTER and killed is None:
                        killed = _serving(urls)
                        before = counters(urls[1 - killed])
                        engines.kill(killed)
                        t_kill = time.monotonic()
            assert killed is not None, "the stream ended before the kill"
            assert not engines.procs[killed].alive() or engines.procs[killed].proc.wait(5) is not None
            survivor = 1 - killed
            after = counters(urls[survivor])
            assert after["predicted"] > before["predicted"], "the surviving replica generated nothing"
            assert len({ch.id for ch in chunks}) == 1, "the client must see one stream (one id)"
            assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.role) <= 1, "a second role chunk leaked"
            finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
            assert finals == ["length"], finals
            assert len(texts) >= MAX_TOKENS - 5, f"only {len(texts)} of {MAX_TOKENS} tokens arrived"
            assert time.monotonic() - t_kill < 60
    finally:
        stop_fleet(engines)
