import pytest

from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet


def sims(n: int = 2, gpu: str = "H100", model: str = "llama-3.1-8b", speedup: float = 50.0):
    return [SimServerConfig(gpu=gpu, model=model, speedup=speedup, port=0) for _ in range(n)]


@pytest.fixture(scope="module")
def fleet():
    """Gateway + 2x H100 Llama-3.1-8B + 1x A100 Qwen2.5-7B engine-sim replicas, 50x real time."""
    # least-request: these tests are about the API surface, spreading must not depend on latency feedback
    with LiveFleet(sims=sims(2) + sims(1, gpu="A100", model="qwen2.5-7b"), policy="least-request", gateway={"max_body_bytes": 1_000_000}) as lf:
        yield lf


@pytest.fixture(scope="module")
def client(fleet):
    from openai import OpenAI

    with OpenAI(base_url=fleet.url + "/v1", api_key="unused", max_retries=0, timeout=30) as c:
        yield c
