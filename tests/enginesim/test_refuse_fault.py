"""refuse_for_s: new connections are refused for a while; streams already in flight go on."""

import asyncio

import httpx
import orjson
import pytest

CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Say something long."}]}


def test_refuse_keeps_streams_in_flight_and_clears_itself_from_the_spec(sim):
    url = sim.sims[0].url
    body = dict(CHAT, stream=True, max_tokens=5000, ignore_eos=True)
    content, done = 0, False
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: {") and orjson.loads(line[6:])["choices"][0]["delta"].get("content"):
                content += 1
                break
        # the hang keeps the stream in flight however fast the engine runs; the refusal closes the listener
        spec = httpx.post(url + "/admin/faults", json={"hang": True, "refuse_for_s": 0.3}).json()
        assert spec["refuse_for_s"] == 0.3 and spec["hang"] is True
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
        for _ in range(100):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.ConnectError:
                sim.call(asyncio.sleep, 0.05)
        else:
            pytest.fail("engine-sim did not listen again after refuse_for_s")
        spec = httpx.get(url + "/admin/faults").json()
        assert spec["refuse_for_s"] == 0.0 and spec["hang"] is True  # the refusal is over, the hang is not
        httpx.delete(url + "/admin/faults")
        for line in lines:
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {") and orjson.loads(line[6:])["choices"][0]["delta"].get("content"):
                content += 1
    assert done and content == 5000


def test_a_new_fault_spec_ends_a_refusal(sim):
    url = sim.sims[0].url
    with httpx.Client(base_url=url, timeout=5) as admin:  # one keep-alive connection, open before the refusal
        admin.post("/admin/faults", json={"refuse_for_s": 60})
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
        assert admin.delete("/admin/faults").json()["refuse_for_s"] == 0.0  # through the connection kept open
    assert httpx.get(url + "/health", timeout=2).status_code == 200
