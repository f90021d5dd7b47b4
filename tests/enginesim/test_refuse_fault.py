"""refuse_for_s: new connections are refused for a while, idle keep-alive ones closed; streams in flight go on."""

import asyncio
import socket

import httpx
import openai
import orjson
import pytest

from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet

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
    # a request already arriving when the refusal began is served (on its own connection, then closed): here a
    # DELETE /admin/faults whose head was half sent before it
    url = sim.sims[0].url
    with socket.create_connection(("127.0.0.1", sim.sims[0].port), timeout=5) as raw:
        raw.sendall(b"DELETE /admin/faults HTTP/1.1\r\nHost: x\r\n")
        assert httpx.get(url + "/health", timeout=2).status_code == 200  # (a round trip: the half head was read)
        httpx.post(url + "/admin/faults", json={"refuse_for_s": 60})
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
        raw.sendall(b"\r\n")
        answer = _read_to_close(raw)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower()
    assert orjson.loads(body)["refuse_for_s"] == 0.0
    assert httpx.get(url + "/health", timeout=2).status_code == 200


def _read_to_close(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):  # the server closes the connection after its answer
        out += chunk
    return out


def test_a_refusal_closes_the_idle_keep_alive_connections_of_a_pooled_client(sim):
    url = sim.sims[0].url
    body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=5) as pooled:
        pooled.chat.completions.create(**body)  # its connection now idle in the pool
        assert httpx.post(url + "/admin/faults", json={"refuse_for_s": 60}).status_code == 200
        for _ in range(3):
            with pytest.raises(openai.APIConnectionError):
                pooled.chat.completions.create(**body)


def test_through_the_gateway_the_only_replica_refusing_is_not_served_over_the_pooled_connections():
    body = {"model": "llama-3.1-8b", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    with LiveFleet(sims=[SimServerConfig(port=0, speedup=50.0)], policy="least-request") as lf:
        with httpx.Client(timeout=30) as c:
            for _ in range(3):  # the gateway's upstream pool holds connections to the replica
                assert c.post(lf.url + "/v1/chat/completions", json=body).status_code == 200
            assert c.post(lf.sims[0].url + "/admin/faults", json={"refuse_for_s": 60}).status_code == 200
            codes = [c.post(lf.url + "/v1/chat/completions", json=body).status_code for _ in range(3)]
    assert 200 not in codes, codes
