"""How a stream ends when its engine fails near the end, or sends what the client must not see, and what a
continuation leg is asked: scripted raw engines on 127.0.0.1 behind the real gateway (the scenario is named by
the user message; each engine request of a scenario plays its next leg).

Found by review (twenty-sixth session), each failing before its fix: a second ``[DONE]`` and usage after an
engine broke past its ``[DONE]``; a second usage when it died between its usage and ``[DONE]``; an error instead
of a clean end when it died after its finish reason with no other replica; a 500 for invalid UTF-8 in an event; a
client's assistant prefill continued as a second assistant message; reasoning restarted on the next leg;
``min_tokens`` and ``stream_options`` not carried into the continuation.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import orjson
import pytest

from steersman.testing import LiveFleet

from cont_streams import raw_engines, serve_script

SCRIPTS: dict[str, list[list]] = {}  # scenario -> legs; a leg: bytes to send, or "reset" (abort), or "end"
BODIES: dict[str, list[dict]] = {}  # scenario -> the engine requests it got


def _ev(leg: int, choices: list, **extra) -> bytes:
    return b"data: " + orjson.dumps({"id": f"E{leg}", "object": "chat.completion.chunk", "created": 100 + leg,
                                     "model": "raw", "choices": choices, **extra}) + b"\n\n"


def role(leg: int = 0) -> bytes:
    return _ev(leg, [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])


def tok(text: str, leg: int = 0, key: str = "content") -> bytes:
    return _ev(leg, [{"index": 0, "delta": {key: text}, "finish_reason": None}])


def fin(leg: int = 0) -> bytes:
    return _ev(leg, [{"index": 0, "delta": {}, "finish_reason": "stop"}])


def usage(p: int, c: int, leg: int = 0) -> bytes:
    return _ev(leg, [], usage={"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c})


DONE = b"data: [DONE]\n\n"


def _steps(req: dict) -> list:
    scenario = next(m["content"] for m in req["messages"] if m["role"] == "user")
    got = BODIES.setdefault(scenario, [])
    got.append(req)
    legs = SCRIPTS[scenario]
    return legs[min(len(got), len(legs)) - 1]


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await serve_script(reader, writer, _steps)


@pytest.fixture(scope="module")
def engines():
    with raw_engines(_handle, 2) as urls:
        yield urls


def _fleet(urls: list[str]) -> LiveFleet:
    return LiveFleet(endpoints=[{"name": f"raw{i}", "url": u, "engine": "openai", "models": ["raw"]}
                                for i, u in enumerate(urls)], policy="round-robin")


def _raw_stream(url: str, scenario: str, **kw) -> bytes:
    """The client's whole response body (raw SSE), and its status."""
    body = {"model": "raw", "stream": True, "messages": [{"role": "user", "content": scenario}], **kw}
    with httpx.Client(timeout=10) as c:
        r = c.post(url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.content


def _events(raw: bytes) -> list:
    out = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: "):
            p = block[6:]
            out.append(p if p == b"[DONE]" else orjson.loads(p))
    return out


def _check_one_clean_end(raw: bytes, text: str) -> None:
    evs = _events(raw)
    assert evs.count(b"[DONE]") == 1 and evs[-1] == b"[DONE]", raw
    objs = [e for e in evs if isinstance(e, dict)]
    assert not any("error" in e for e in objs), raw
    assert sum(1 for e in objs if e.get("usage")) == 1, raw
    assert [e["finish_reason"] for o in objs for e in o["choices"] if e.get("finish_reason")] == ["stop"]
    assert "".join(c["delta"].get("content") or "" for o in objs for c in o["choices"]) == text


@pytest.mark.parametrize("scenario,leg", [
    ("done then reset", [role(), tok("a"), tok("b"), fin(), usage(5, 2), DONE, "reset"]),  # broke after [DONE]
    ("usage then reset", [role(), tok("a"), tok("b"), fin(), usage(5, 2), "reset"]),  # between usage and [DONE]
    ("finish then reset", [role(), tok("a"), tok("b"), fin(), "reset"]),  # after its finish reason
    ("finish then garbage", [role(), tok("a"), tok("b"), fin(), b"data: {not json\n\n", "reset"]),
])
def test_an_engine_failing_after_the_last_token_ends_the_stream_once_without_another_replica(engines, scenario, leg):
    SCRIPTS[scenario] = [leg]
    with _fleet(engines[:1]) as lf:  # one replica: nowhere to continue, and nothing left to continue
        raw = _raw_stream(lf.url, scenario, stream_options={"include_usage": True})
    _check_one_clean_end(raw, "ab")
    assert len(BODIES[scenario]) == 1


def test_invalid_utf8_from_the_engine_is_a_malformed_stream_retried_elsewhere(engines):
    bad = b'data: {"id":"E0","object":"chat.completion.chunk","created":1,"model":"raw","choices":[{"index":0,' \
          b'"delta":{"content":"\xff\xfe"},"finish_reason":null}]}\n\n'
    SCRIPTS["bad utf8"] = [[role() + bad, "reset"], [role(1), tok("ok", 1), fin(1), DONE]]
    with _fleet(engines) as lf:
        raw = _raw_stream(lf.url, "bad utf8")  # was a 500 (a traceback in the log)
    assert b"\xff" not in raw
    evs = [e for e in _events(raw) if isinstance(e, dict)]
    assert "".join(c["delta"].get("content") or "" for o in evs for c in o["choices"]) == "ok"


def test_a_continuation_extends_the_clients_own_prefill_and_carries_its_options(engines):
    SCRIPTS["prefill"] = [[role(), tok(" red"), tok(" and"), "reset"], [role(1), tok(" blue", 1), fin(1), DONE]]
    with _fleet(engines) as lf:
        raw = _raw_stream(lf.url, "prefill", max_tokens=8, min_tokens=5, continue_final_message=True,
                          add_generation_prompt=False,
                          stream_options={"include_usage": True, "continuous_usage_stats": True},
                          messages=[{"role": "user", "content": "prefill"},
                                    {"role": "assistant", "content": "Roses are"}])
    leg2 = BODIES["prefill"][1]
    assert leg2["messages"] == [{"role": "user", "content": "prefill"},
                                {"role": "assistant", "content": "Roses are red and"}]  # not a second message
    assert leg2["max_tokens"] == 6 and leg2["min_tokens"] == 3  # (vLLM refuses min_tokens > max_tokens)
    assert leg2["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    evs = [e for e in _events(raw) if isinstance(e, dict)]
    assert "".join(c["delta"].get("content") or "" for o in evs for c in o["choices"]) == " red and blue"


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_a_reasoning_stream_is_not_continued(engines, key):
    scenario = f"think {key}"
    SCRIPTS[scenario] = [[role(), tok("Let me think", key=key), "reset"], [role(1), tok(" more", 1, key), DONE]]
    with _fleet(engines) as lf, openai.OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0,
                                              timeout=10) as client:
        with pytest.raises(openai.APIError, match="reasoning in progress"):
            for _ in client.chat.completions.create(model="raw", stream=True,
                                                    messages=[{"role": "user", "content": scenario}]):
                pass
    assert len(BODIES[scenario]) == 1  # continued, its reasoning would have started over as the answer


def test_a_client_too_slow_to_read_is_not_a_frozen_engine(engines):
    """The idle sweep drops an engine silent for ``stream_idle_timeout_s``; while the client cannot keep up the
    gateway itself stops reading the engine: that silence is not the engine's.  Swept, a healthy engine was marked
    failed and the stream continued on another replica (a second prefill), the new leg unpaused: its whole answer
    buffered in the gateway."""
    import socket
    import time

    piece = "x" * 16000
    SCRIPTS["slow reader"] = [[role()] + [tok(piece)] * 400 + [fin(), DONE]] * 2
    with LiveFleet(endpoints=[{"name": f"raw{i}", "url": u, "engine": "openai", "models": ["raw"]}
                              for i, u in enumerate(engines)], policy="round-robin",
                   extra={"reliability": {"stream_idle_timeout_s": 0.3}}) as lf:
        host, port = lf.url.removeprefix("http://").split(":")
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((host, int(port)))
        body = orjson.dumps({"model": "raw", "stream": True, "messages": [{"role": "user", "content": "slow reader"}]})
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        time.sleep(1.5)  # five idle timeouts without reading
        got = b""
        s.settimeout(10)
        while not got.endswith(b"0\r\n\r\n"):
            chunk = s.recv(1 << 20)
            assert chunk, "the gateway closed the stream"
            got += chunk
        s.close()
        metrics = httpx.get(lf.url + "/metrics").text
    assert len(BODIES["slow reader"]) == 1  # one engine request: not continued elsewhere
    assert got.count(b'"finish_reason":"stop"') == 1 and b"data: [DONE]" in got and b'"error"' not in got
    assert 'outcome="stream_idle"' not in metrics
