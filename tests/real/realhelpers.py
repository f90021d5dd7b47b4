"""Helpers for the end-to-end tests with real llama-server replicas (Gemma 3 270M).

`make test` builds the binary and the GGUF first (scripts/build-llama-server.sh, cached
outside the repository); run alone, these tests skip with the reason when either is absent.
"""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

from steersman.engines.llamacpp import SlotState, parse_slots
from steersman.engines.promtext import read_samples
from steersman.fleet.processes import LlamaServerFleet, find_gguf, find_llama_server

MODEL = "gemma-3-270m"


def function_tool(name: str, description: str) -> dict:
    """An OpenAI function tool taking one string argument, ``city``."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


WEATHER = function_tool("get_weather", "Weather for a city")
CLOCK = function_tool("get_time", "Local time in a city")


def require_binary() -> None:
    if find_llama_server() is None or find_gguf() is None:
        pytest.skip("llama-server or the Gemma 3 270M GGUF is not built: run `make llama` (make test does it first)")


def start_fleet(n: int) -> LlamaServerFleet:
    require_binary()
    f = LlamaServerFleet(n)
    asyncio.run(f.start())
    return f


def stop_fleet(f: LlamaServerFleet) -> None:
    asyncio.run(f.stop())


def get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def counters(url: str) -> dict[str, float]:
    """The replica's prompt-token counters: processed (computed) and cached (reused)."""
    text = get(url + "/metrics").decode()
    names = {"llamacpp:prompt_tokens_total": "processed", "llamacpp:prompt_tokens_cached_total": "cached",
             "llamacpp:tokens_predicted_total": "predicted"}
    v = read_samples(text, names)
    return {k: v.get(k, 0.0) for k in names.values()}


def slots(url: str) -> list[SlotState]:
    import orjson

    return parse_slots(orjson.loads(get(url + "/slots")))
