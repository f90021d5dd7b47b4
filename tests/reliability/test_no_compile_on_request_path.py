"""No request compiles a kernel: the gateway's start-up warm-up covers every path, failures included.

Numba compiles (or loads from disk) a kernel once per argument-type signature, on the calling
thread: on the gateway, the event loop.  A signature first met by a request stalls every stream in
flight: the first stream continuation after start took 943 ms instead of 12 ms with a cold numba
cache (every upgrade), ~20 ms with a warm one, because a retry's ``excluded`` array was writable and
every other array the kernels read is not (another signature).  Each run is a fresh interpreter
(``compile_probe.py``), as a gateway process starts: in this one, other tests compiled much already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("compile_probe.py")


@pytest.mark.parametrize("policy", ["steersman", "llm-d"])  # the fused decision path; the plugin-by-plugin one
def test_live_scenarios_compile_nothing_after_start(policy):
    run = subprocess.run([sys.executable, str(PROBE), policy], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    compiled = {name: added for name, added in out["scenarios"].items() if added}
    assert not compiled, f"kernels compiled on the request path after start: {compiled}"
    assert len(out["scenarios"]) == 11
    m = out["metrics"]
    # the failure paths really ran: a retry away from a refusing replica (the refusal takes it out of rotation, so
    # the retry re-routes without a budget token), a stream continued elsewhere
    assert m.get('steersman:retries_total{outcome="rerouted"}', 0) >= 1, m
    assert m.get('steersman:stream_migrations_total{model="llama-3.1-8b"}', 0) >= 1, m
