"""vLLM's ``truncate_prompt_tokens`` (chat, completions, embeddings): k >= 1 keeps each prompt's last k tokens, -1 the
model's context.  The gateway counted and hashed the whole prompt: an embedding request of a 40,000-token document
truncated to 512 tokens was scheduled, rate-limited and budgeted as 40,000 tokens of prefill.  Now the tokens it
schedules are the ones the engine keeps; a value vLLM refuses is a 400 naming the field."""

import httpx
import msgspec
import numpy as np
from openai import OpenAI

from steersman.api.embeddings import EmbeddingRequest
from steersman.api.prompt import batch_shape
from steersman.api.schema import ChatCompletionRequest, CompletionRequest
from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet
from steersman.text.chat_tokens import tokenize_chat_array
from steersman.text.tokenizer import block_hash_tuple, tokenize_array

DOC = "the quarterly report covers revenue, churn and hiring across every region " * 400  # ~5,000 tokens
BS = 16


def _req(cls, **kw):
    return msgspec.convert({"model": "m", **kw}, cls)


def test_the_gateway_counts_and_hashes_the_tokens_the_engine_keeps():
    ids = tokenize_array(DOC)
    assert ids.size > 4000
    for cls, field, value in ((EmbeddingRequest, "input", DOC), (CompletionRequest, "prompt", DOC)):
        tokens, hashes, _ = batch_shape(_req(cls, **{field: value, "truncate_prompt_tokens": 512}), BS)
        assert tokens == 512 and hashes == block_hash_tuple(ids[-512:], BS), cls
        assert batch_shape(_req(cls, **{field: value}), BS)[0] == ids.size  # untruncated: all of it
        assert batch_shape(_req(cls, **{field: value, "truncate_prompt_tokens": -1}), BS)[0] == ids.size
    batch = _req(EmbeddingRequest, input=[DOC, "short one", DOC], truncate_prompt_tokens=300)
    tokens, _, longest = batch_shape(batch, BS)
    assert tokens == 300 + len(tokenize_array("short one")) + 300 and longest == 300
    msgs = [{"role": "user", "content": DOC}]
    chat = _req(ChatCompletionRequest, messages=msgs, truncate_prompt_tokens=1000)
    whole = tokenize_chat_array(chat.messages, False, None, None)
    tokens, hashes, _ = batch_shape(chat, BS)
    assert tokens == 1000 and hashes == block_hash_tuple(np.asarray(whole)[-1000:], BS)


def test_the_engine_and_the_gateway_agree_live():
    with LiveFleet(sims=[SimServerConfig(port=0, speedup=50.0, model="gemma-3-270m")]) as lf:
        with OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
            doc = "word " * 40_000  # past the model's 32,768-token context: refused whole, taken truncated
            e = c.embeddings.create(model="gemma-3-270m", input=doc, extra_body={"truncate_prompt_tokens": 512})
            assert e.usage.prompt_tokens == 512
            r = c.completions.create(model="gemma-3-270m", prompt=doc, max_tokens=2,
                                     extra_body={"truncate_prompt_tokens": 300})
            assert r.usage.prompt_tokens == 300
        for bad in (0, -2, "many", 1.5):
            for path, body in (("/v1/embeddings", {"input": "hi"}), ("/v1/completions", {"prompt": "hi"}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
                r = httpx.post(lf.url + path, json={"model": "gemma-3-270m", "truncate_prompt_tokens": bad, **body})
                assert r.status_code == 400, (path, bad, r.text)
                assert r.json()["error"]["param"] == "truncate_prompt_tokens", (path, bad, r.text)
