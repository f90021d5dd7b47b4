"""An engine-sim replica publishing vLLM's KV events; the gateway reads its cache from them (real HTTP, real ZMQ)."""

from __future__ import annotations

import json
import time

import httpx

from steersman.api.prompt import prompt_shape
from steersman.api.schema import decode_chat
from steersman.text.chat_tokens import tokenize_chat_array

from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet


def _wait(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_the_gateway_mirrors_what_the_engine_caches():
    from openai import OpenAI

    sims = [SimServerConfig(gpu="H100", model="llama-3.1-8b", speedup=50.0, port=0,
                            kv_events_endpoint="tcp://127.0.0.1:*"),
            SimServerConfig(gpu="H100", model="llama-3.1-8b", speedup=50.0, port=0,
                            kv_events_endpoint="tcp://127.0.0.1:*"),
            SimServerConfig(gpu="H100", model="llama-3.1-8b", speedup=50.0, port=0)]
    with LiveFleet(sims=sims, policy="steersman", extra={"scheduler": {"kv_events_mismatch_after": 7}}) as lf:
        gw = lf.gateway
        index = gw.fleet.prefix
        assert set(index.events) == {0, 1}  # the replicas that publish
        assert {m.mismatch_after for m in index.events.values()} == {7}  # the fleet file's setting
        client = OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        system = "You are a careful assistant. " * 60
        for k in range(6):
            r = client.chat.completions.create(model="llama-3.1-8b", max_tokens=4, messages=[
                {"role": "system", "content": system}, {"role": "user", "content": f"question {k}"}])
            assert r.choices[0].message.content
        # what each engine holds now is what the gateway's mirror of it holds (events flushed after each step)
        total = 0
        for i in (0, 1):
            pool = lf.sims[i].engine.kv
            cached = {h for s in pool._segments() for h in s.hs[s.lo : s.hi]}
            total += len(cached)
            _wait(lambda: lf.call(_held, index.events[i]) == cached, f"sim-{i}'s mirror never caught up with its cache")
        assert total, "the engines cached nothing"
        # the engines' hashes are the gateway's: a prompt sharing the system prompt matches it from the mirrors
        body = json.dumps({"model": "llama-3.1-8b", "messages": [{"role": "system", "content": system},
                                                                 {"role": "user", "content": "another question"}]})
        tokens, hashes = prompt_shape(decode_chat(body.encode(), 1 << 20, 20), gw.block_size)
        shared = len(tokenize_chat_array([{"role": "system", "content": system}])) // gw.block_size - 1
        got = lf.call(_match, index, hashes)
        assert max(got) >= shared > 10, (got, shared)
        assert set(index.events) == {0, 1}  # their hashes are the gateway's: still read from the events
        assert lf.call(_pending, index) == 0  # prompts routed there count only until their first token
        lines = [ln for ln in httpx.get(lf.url + "/metrics").text.splitlines() if ln.startswith("steersman:kv_events_total")]
        assert any('kind="stored"' in ln and float(ln.split()[-1]) > 0 for ln in lines)
        assert not any('replica="sim-2"' in ln for ln in lines)  # the replica without events has no subscriber
        client.close()


async def _pending(index):
    return sum(len(m._pending) for m in index.events.values())


async def _match(index, hashes):
    return index.match(hashes).tolist()


async def _held(mirror):  # read on the fleet's loop, where the subscriber writes
    return set(mirror._held)


def test_serve_with_kv_events_on_a_simulated_fleet(tmp_path):
    """`steersman serve` with scheduler.kv_events: its engine-sim children publish, the gateway subscribes."""
    import signal
    import subprocess
    import sys

    from openai import OpenAI

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("gateway: {port: 0}\nscheduler: {kv_events: true}\n"
                     "simulated: {speedup: 20, replicas: [{gpu: H100, model: llama-3.1-8b, count: 2}]}\n")
    proc = subprocess.Popen([sys.executable, "-m", "steersman", "serve", "--config", str(fleet)],
                            stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "no ready line"
            if line.startswith("steersman ready"):
                url = line.split()[-1]
                break
        with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
            for k in range(3):
                client.chat.completions.create(model="llama-3.1-8b", max_tokens=2, messages=[
                    {"role": "user", "content": "a shared context " * 80 + str(k)}])

        def stored() -> float:
            lines = [ln for ln in httpx.get(url + "/metrics").text.splitlines()
                     if ln.startswith("steersman:kv_events_total") and 'kind="stored"' in ln]
            return sum(float(ln.split()[-1]) for ln in lines)

        _wait(lambda: stored() > 0, "no KV events reached the gateway")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_bad_kv_events_endpoints_are_clear_errors(tmp_path):
    import subprocess
    import sys

    import pytest

    from steersman.fleet.config import FleetConfigError, parse_fleet

    with pytest.raises(FleetConfigError, match=r"endpoints\[0\].kv_events must be a ZMQ endpoint, tcp://HOST:PORT"):
        parse_fleet({"endpoints": [{"url": "http://127.0.0.1:1", "kv_events": "http://127.0.0.1:5557"}]})
    with pytest.raises(FleetConfigError, match=r"endpoints\[0\].kv_events_replay must be a ZMQ endpoint"):
        parse_fleet({"endpoints": [{"url": "http://127.0.0.1:1", "kv_events": "tcp://127.0.0.1:5557",
                                    "kv_events_replay": "5558"}]})
    for bad in ("tcp://10.0.0.5", "tcp://:5557", "tcp://host:0", "tcp://host:70000", "tcp://host:port", "ipc://"):
        # (libzmq refuses these only when the gateway's subscriber connects, after start)
        with pytest.raises(FleetConfigError, match=r"endpoints\[0\].kv_events must be a ZMQ endpoint"):
            parse_fleet({"endpoints": [{"url": "http://127.0.0.1:1", "kv_events": bad}]})
    for good in ("tcp://10.0.0.5:5557", "tcp://vllm-0.vllm:5557", "tcp://[::1]:5557", "ipc:///tmp/kv-events"):
        parse_fleet({"endpoints": [{"url": "http://127.0.0.1:1", "kv_events": good}]})
    with pytest.raises(FleetConfigError, match=r"endpoints\[0\].kv_events_replay needs endpoints\[0\].kv_events"):
        parse_fleet({"endpoints": [{"url": "http://127.0.0.1:1", "kv_events_replay": "tcp://127.0.0.1:5558"}]})
    r = subprocess.run([sys.executable, "-m", "steersman", "engine-sim", "--port", "0", "--kv-events-endpoint", "5557"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--kv-events-endpoint" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "steersman", "engine-sim", "--port", "0", "--kv-events-replay-endpoint",
                        "tcp://127.0.0.1:*"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "needs --kv-events-endpoint" in r.stderr and "Traceback" not in r.stderr


def test_a_simulated_fleet_publishes_with_a_replay_socket_the_gateway_is_told_of():
    """scheduler.kv_events on a fleet file's simulated: section: each engine-sim binds a replay socket too (vLLM's
    replay_endpoint), and its endpoint names it, so the gateway recovers what a gap, or its own late start, missed."""
    import asyncio

    import zmq
    import zmq.asyncio

    from steersman.engines.kv_events import END_SEQ
    from steersman.fleet.config import SimReplicaConfig, SimulatedFleetConfig
    from steersman.fleet.embedded import SimulatedFleet

    async def main() -> None:
        fleet = SimulatedFleet(SimulatedFleetConfig(speedup=20.0, replicas=[
            SimReplicaConfig(gpu="H100", model="llama-3.1-8b", count=1)]), kv_events=True)
        (ep,) = await fleet.start()
        try:
            assert ep.kv_events.startswith("tcp://127.0.0.1:") and ep.kv_events_replay.startswith("tcp://127.0.0.1:")
            dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(ep.kv_events_replay)
            await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            frames = await asyncio.wait_for(dealer.recv_multipart(), 10)  # nothing published yet: the end at once
            assert frames == [b"", END_SEQ, b""]
            dealer.close(0)
        finally:
            await fleet.stop()

    asyncio.run(main())
