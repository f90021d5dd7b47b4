"""/v1/embeddings through the gateway to engine-sim replicas, with the official client (which asks for base64)."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

from steersman.api.embeddings import decode_embedding
from steersman.api.errors import ApiError
from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet

MODEL = "llama-3.1-8b"


def test_vectors_for_one_input_and_a_batch_equal_on_every_replica(client, fleet):
    texts = ["The cat sat on the mat.", "The cat sat on a mat.", "Quantum chromodynamics is hard."]
    r = client.embeddings.create(model=MODEL, input=texts)
    v = np.array([d.embedding for d in r.data])
    assert v.shape == (3, 4096) and [d.index for d in r.data] == [0, 1, 2] and r.model == MODEL
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > 0.7 > 0.4 > v[0] @ v[2]  # shared tokens make near vectors
    one = [np.array(client.embeddings.create(model=MODEL, input=texts[0]).data[0].embedding) for _ in range(4)]
    assert all(np.allclose(x, v[0], atol=1e-6) for x in one)  # spread over both replicas: the same vector
    assert r.usage.prompt_tokens == r.usage.total_tokens > 12
    short = client.embeddings.create(model=MODEL, input=texts[0], dimensions=256, encoding_format="float")
    s = np.array(short.data[0].embedding)
    assert s.shape == (256,) and abs(np.linalg.norm(s) - 1) < 1e-5 and s @ (v[0][:256] / np.linalg.norm(v[0][:256])) > 0.999
    raw = httpx.post(fleet.url + "/v1/embeddings", json={"model": MODEL, "input": [[1, 2, 3], [4, 5]],
                                                         "encoding_format": "base64"}).json()
    vec = np.frombuffer(base64.b64decode(raw["data"][1]["embedding"]), dtype="<f4")
    assert vec.shape == (4096,) and raw["usage"]["prompt_tokens"] == 5 and raw["object"] == "list"


@pytest.mark.parametrize("kw,param,status", [
    ({"input": ""}, "input", 400),
    ({"input": []}, "input", 400),
    ({"input": ["a", ""]}, "input[1]", 400),
    ({"input": ["a", 3]}, "input", 400),
    ({"input": [[1, -2]]}, "input[0]", 400),
    ({"input": [[1, 10**9]]}, "input[0]", 400),  # out of the model's vocabulary (the engine's check, relayed)
    ({"input": "x", "encoding_format": "hex"}, "encoding_format", 400),
    ({"input": "x", "dimensions": 0}, "dimensions", 400),
    ({"input": "x", "dimensions": 10**6}, "dimensions", 400),  # wider than the model's vectors (the engine's)
    ({"input": "word " * 150_000}, "input", 400),  # longer than any replica's context: context_length_exceeded
    ({"input": "x", "model": "nope"}, "model", 404),
    ({"input": 5}, "input", 400),
])
def test_bad_input_is_a_400_naming_the_field(client, kw, param, status):
    with pytest.raises(openai.APIStatusError) as e:
        client.embeddings.create(**{"model": MODEL, **kw})
    assert e.value.status_code == status and e.value.body["param"] == param, e.value.body


def test_the_request_is_checked_before_any_engine_sees_it():
    for body in (b'{"model": "m", "input": ["a", 1]}', b'{"model": "", "input": "a"}', b'{"input": "a"}',
                 b'{"model": "m", "input": "a", "dimensions": "8"}', b'{"model": "m", "input": ' + b'["a"' + b',"a"' * 2048 + b"]}"):
        with pytest.raises(ApiError) as e:
            decode_embedding(body)
        assert e.value.status == 400 and e.value.param in ("input", "model", "dimensions")
    assert decode_embedding(b'{"model": "m", "input": [1, 2]}').prompt == [1, 2]


def test_an_engine_failure_is_retried_on_another_replica():
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0) for _ in range(2)], policy="round-robin") as lf:
        async def fail():
            from steersman.enginesim.faults import FaultSpec

            lf.sims[0].faults.apply(FaultSpec(error_rate=1.0))

        lf.call(fail)
        with openai.OpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
            for _ in range(4):  # half go to the failing replica first: each is retried and served
                assert len(c.embeddings.create(model=MODEL, input="hello").data[0].embedding) == 4096


def test_an_engine_that_does_not_implement_the_request_is_a_400_not_a_replica_failure():
    """A llama.cpp audit: llama-server without ``--embeddings`` answers /v1/embeddings 501; the gateway retried it
    on the other replica and counted each as the replica's failure, so 14 such calls ejected both healthy replicas.
    A 501 refuses what the request asks for: relayed as a 400 ``unsupported_value``, not retried, not counted."""
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0) for _ in range(2)], policy="round-robin") as lf:
        async def unimplemented():
            from steersman.enginesim.faults import FaultSpec

            for sim in lf.sims:
                sim.faults.apply(FaultSpec(error_rate=1.0, error_status=501))

        lf.call(unimplemented)
        with openai.OpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
            for _ in range(14):
                with pytest.raises(openai.BadRequestError) as e:
                    c.embeddings.create(model=MODEL, input="hello")
                assert e.value.status_code == 400  # engine-sim's fault names its own code (injected_fault)
        assert not lf.gateway.fleet.guard.outliers.is_ejected(0, lf.gateway.clock.now())
        assert not lf.gateway.fleet.guard.outliers.is_ejected(1, lf.gateway.clock.now())
        metrics = httpx.get(lf.url + "/metrics").text
        assert "http_501" not in metrics  # not an upstream error


def test_a_batch_whose_inputs_each_fit_is_served_though_together_they_pass_the_kv_cache():
    """The engine runs a batch's inputs as sequences of their own: whether a replica can ever hold the request is
    judged by the longest input, not the sum (100 inputs of ~1,000 tokens against a 45,920-token cache was a 400
    context_length_exceeded telling the client to shorten its input)."""
    from steersman.config import EngineSettings

    cfg = SimServerConfig(gpu="L40S", speedup=200.0, port=0,
                          engine=EngineSettings(gpu_memory_utilization=0.45, max_model_len=8192))
    text = " ".join(f"w{i}" for i in range(500))
    with LiveFleet(sims=[cfg]) as lf:
        client = openai.OpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0)
        out = client.embeddings.create(model=MODEL, input=[f"{k} " + text for k in range(100)])
        assert len(out.data) == 100 and out.usage.prompt_tokens > 45_920
        one_too_long = " ".join(f"w{i}" for i in range(60_000))
        with pytest.raises(openai.BadRequestError):  # one input past every cache (and the context): still a 400
            client.embeddings.create(model=MODEL, input=["short", one_too_long])
