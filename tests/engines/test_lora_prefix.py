"""LoRA adapters' prompts are keyed apart in the prefix index.

An engine serving LoRA adapters keeps each adapter's KV apart (vLLM hashes ``lora_name`` into every block): a
prompt cached for an adapter is no hit for the base model or another adapter on that replica.  The gateway hashed
every model's prompt alike, so a replica that ran a prompt for one adapter was credited with it for every model it
serves: the request went there for a cache it did not have, predicted a prefill it did not save, and the replica's
learnt prefix accuracy fell for the base model's requests too.  engine-sim serves adapters as vLLM does
(``--lora-modules``, listed in ``/v1/models`` with the model as ``parent``)."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest
from openai import OpenAI

from steersman.api.prompt import prompt_shape
from steersman.api.schema import decode_chat

from steersman.engines.base import model_list
from steersman.enginesim.app import SimServerConfig
from steersman.fleet import snapshot as S
from steersman.fleet.config import FleetConfigError, parse_fleet
from steersman.testing import LiveFleet
from steersman.text.lora import lora_key, rekeyed
from steersman.text.tokenizer import block_hash_tuple

MODEL, LORA, OTHER = "llama-3.1-8b", "sql-lora", "chat-lora"
PROMPT = "You translate questions into SQL for the warehouse schema. " * 60  # ~700 tokens: 40+ blocks


def test_keys_keep_prefixes_within_a_model_and_apart_across_models():
    ids = np.arange(160, dtype=np.int64)
    base = block_hash_tuple(ids, 16)
    a, b = rekeyed(base, lora_key(LORA)), rekeyed(base, lora_key(OTHER))
    assert rekeyed(base, 0) is base and len(set(base) | set(a) | set(b)) == 30
    assert rekeyed(block_hash_tuple(ids[:80], 16), lora_key(LORA)) == a[:5]  # a prefix is still a prefix
    assert rekeyed(a, lora_key(LORA) ^ lora_key(OTHER)) == b  # moved from one adapter to another
    assert rekeyed(tuple(base), lora_key(LORA)) == a  # a plain tuple too


def test_vllms_model_list_says_which_models_are_adapters():
    # vLLM's /v1/models with --lora-modules (serving_models.show_available_models: a LoRA card's parent is the base)
    page = {"object": "list", "data": [
        {"id": MODEL, "object": "model", "root": "/models/llama", "parent": None, "max_model_len": 8192},
        {"id": LORA, "object": "model", "root": "/adapters/sql", "parent": MODEL, "max_model_len": 8192}]}
    got = model_list(page)
    assert got == [MODEL, LORA] and got.loras == (LORA,)
    assert model_list({"data": [{"id": "m"}]}).loras == ()  # no parent field (llama.cpp, SGLang): none


def test_the_fleet_file_names_adapters_beside_their_base_model():
    ok = parse_fleet({"endpoints": [{"url": "http://127.0.0.1:8000", "engine": "vllm", "models": [MODEL],
                                     "lora_modules": [LORA]}]})
    assert ok.endpoints[0].lora_modules == [LORA]
    with pytest.raises(FleetConfigError, match=r"endpoints\[0\]\.lora_modules needs endpoints\[0\]\.models"):
        parse_fleet({"endpoints": [{"url": "http://127.0.0.1:8000", "lora_modules": [LORA]}]})
    with pytest.raises(FleetConfigError, match=r"endpoints\[0\]\.lora_modules: 'm' is in models too"):
        parse_fleet({"endpoints": [{"url": "http://127.0.0.1:8000", "models": ["m"], "lora_modules": ["m"]}]})
    with pytest.raises(FleetConfigError, match=r"endpoints\[1\]\.models: 'a' is a LoRA adapter of endpoints\[0\]"):
        parse_fleet({"endpoints": [{"url": "http://127.0.0.1:8000", "models": ["m"], "lora_modules": ["a"]},
                                   {"url": "http://127.0.0.1:8001", "models": ["a"]}]})


def test_engine_sim_refuses_an_adapter_named_as_its_model():
    from steersman.enginesim.app import SimServer

    with pytest.raises(ValueError, match="model's own name"):
        SimServer(SimServerConfig(lora_modules=(MODEL,)))


def _chat(c: OpenAI, model: str, question: str):
    return c.chat.completions.create(model=model, max_tokens=2, temperature=0, extra_headers={"x-steersman-slo": "batch"},
                                     messages=[{"role": "system", "content": PROMPT}, {"role": "user", "content": question}])


async def _accuracy(gw) -> list[float]:
    return gw.fleet.live[S.PREFIX_ACCURACY].tolist()


async def _holders(gw, model: str) -> list[int]:
    """The replicas the index credits with the system prompt's blocks for ``model``."""
    body = {"model": model, "messages": [{"role": "system", "content": PROMPT}, {"role": "user", "content": "x"}]}
    _, hashes = prompt_shape(decode_chat(orjson.dumps(body), 100_000), gw.block_size)
    hashes = rekeyed(hashes, gw.fleet.lora_keys.get(model, 0))
    return gw.fleet.prefix.reusable(hashes, 10_000, gw.block_size).tolist()


def _drive(lf: LiveFleet) -> None:
    with OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        assert {m.id for m in c.models.list().data} == {MODEL, LORA}
        first = _chat(c, LORA, "List the tables.")
        assert first.model == LORA  # (the engine answers with the adapter's name, as vLLM)
        for k in range(4):
            _chat(c, MODEL, f"Question {k}.")
        # the base model's requests were not credited with the adapter's KV: no hit predicted that the engine did
        # not have, and the learnt prefix accuracy stays whole (0.81 here when every model's prompt hashed alike)
        assert lf.call(_accuracy, lf.gateway) == [1.0, 1.0]
        held = lf.call(_holders, lf.gateway, LORA)
        r = int(np.argmax(held))
        assert held[r] >= 40 and held[1 - r] == 0  # where the adapter's request ran, for the adapter only
        again = _chat(c, LORA, "List the columns.")  # the adapter's own prompt again: a hit where it ran
        assert again.usage.prompt_tokens_details.cached_tokens >= 40 * 16
        assert lf.call(_accuracy, lf.gateway) == [1.0, 1.0]
        assert c.embeddings.create(model=LORA, input="a query").model == LORA


def test_an_adapters_cached_prompt_is_no_hit_for_the_base_model_named_in_the_fleet_file():
    sims = [SimServerConfig(port=0, speedup=50.0, lora_modules=(LORA,)) for _ in range(2)]
    with LiveFleet(sims=sims) as lf:
        assert lf.gateway.fleet.lora_keys == {LORA: lora_key(LORA)}
        _drive(lf)


def test_adapters_are_found_in_the_engines_model_list():
    sims = [SimServerConfig(port=0, speedup=50.0, lora_modules=(LORA,)) for _ in range(2)]
    with LiveFleet(sims=sims, with_gateway=False) as engines:
        eps = [{"name": f"e{i}", "url": s.url, "engine": "engine-sim", "gpu": "H100"} for i, s in enumerate(engines.sims)]
        with LiveFleet(endpoints=eps) as lf:
            deadline = time.monotonic() + 10
            while lf.gateway.fleet.lora_keys != {LORA: lora_key(LORA)}:
                assert time.monotonic() < deadline, "the adapters were never listed"
                time.sleep(0.02)
            _drive(lf)
