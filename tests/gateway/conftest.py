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


def serve_process(cfg, log, timeout_s: float = 120.0):
    """``steersman serve --config cfg`` in its own session, stderr to ``log``: (the process, its URL) once it printed
    that it is ready; AssertionError with the log's end if it exits or is not ready in time."""
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "steersman", "serve", "--config", str(cfg)], stdout=subprocess.PIPE,
                            stderr=open(log, "w"), text=True, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"gateway exited ({proc.poll()}): {open(log).read()[-2000:]}")
        if line.startswith("steersman ready"):
            return proc, line.split()[-1]
    proc.kill()
    raise AssertionError("gateway not ready")


def stop_process(proc, grace_s: float = 20.0) -> None:
    """SIGTERM (a graceful stop), then SIGKILL after ``grace_s``; nothing if it already exited."""
    import signal
    import subprocess

    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
