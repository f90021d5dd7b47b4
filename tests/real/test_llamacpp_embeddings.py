"""/v1/embeddings through the gateway to a real llama-server started with ``--embeddings --pooling mean`` (Gemma 3
270M's mean-pooled hidden states), beside a generating replica: each model's requests reach its own replica."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from openai import OpenAI

from steersman.config import DEFAULTS
from steersman.fleet.processes import LlamaServerFleet
from steersman.testing import LiveFleet

from realhelpers import MODEL, require_binary, start_fleet, stop_fleet

pytestmark = pytest.mark.timeout(300)
EMBED = "gemma-3-270m-embed"


@pytest.fixture(scope="module")
def client():
    require_binary()
    embed = LlamaServerFleet(1, dataclasses.replace(DEFAULTS.llamacpp, model_name=EMBED),
                             extra_args=("--embeddings", "--pooling", "mean"), name_prefix="embed")
    asyncio.run(embed.start())
    chat = start_fleet(1)
    try:
        with LiveFleet(endpoints=embed.endpoints() + chat.endpoints(), policy="steersman") as lf:
            with OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=120,
                        default_headers={"x-steersman-slo": "batch"}) as c:
                yield c
    finally:
        asyncio.run(embed.stop())
        stop_fleet(chat)


def test_a_real_engine_embeds_through_the_gateway(client):
    texts = ["The cat sat on the mat.", "A cat was sitting on the mat.", "Interest rates rose sharply in March."]
    r = client.embeddings.create(model=EMBED, input=texts)  # the client asks for base64 and decodes it
    v = np.array([d.embedding for d in r.data])
    assert v.shape == (3, 640) and [d.index for d in r.data] == [0, 1, 2]  # Gemma 3 270M's hidden size
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-3)  # llama-server normalises (L2) by default
    assert v[0] @ v[1] > v[0] @ v[2]  # the paraphrase is nearer than the other topic
    assert r.usage.prompt_tokens > 15 and r.model
    floats = client.embeddings.create(model=EMBED, input=texts[0], encoding_format="float")
    assert np.allclose(floats.data[0].embedding, v[0], atol=1e-5)
    # the generating model is served beside it, by its own replica
    out = client.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert out.choices[0].message.content is not None
