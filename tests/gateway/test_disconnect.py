"""A client that goes away cancels the request on the engine (no wasted GPU work)."""

import time

import httpx
import orjson

from steersman.enginesim.app import SimServerConfig
from steersman.engines.promtext import read_labelled
from steersman.testing import LiveFleet


def _aborts(url: str) -> float:
    return read_labelled(httpx.get(url + "/metrics").text, "vllm:request_success_total", "finished_reason").get("abort", 0.0)


def test_client_disconnect_cancels_upstream():
    with LiveFleet(sims=[SimServerConfig(speedup=10.0, port=0)]) as lf:
        eng = lf.sims[0]
        body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "long answer please"}],
                "max_tokens": 2000, "ignore_eos": True, "stream": True}
        got = 0
        with httpx.stream("POST", lf.url + "/v1/chat/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and orjson.loads(line[6:])["choices"][0]["delta"].get("content"):
                    got += 1
                    if got == 3:
                        break  # leaving the block closes the connection mid-stream
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (_aborts(eng.url) < 1 or eng.engine.state().num_running):
            lf.call(_tick)
        assert _aborts(eng.url) == 1
        state = eng.engine.state()
        assert state.num_running == 0 and state.num_waiting == 0 and state.kv_blocks_used == 0
        assert lf.gateway.fleet.in_flight.sum() == 0
        # far fewer tokens were generated than asked for
        assert state.generation_tokens_total < 500


async def _tick():
    import asyncio

    await asyncio.sleep(0.05)
