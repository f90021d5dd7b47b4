"""Speed micro-check (prints, no timed assertion): steps/s with 256 decoding requests."""

from __future__ import annotations

import math
import time

from simhelpers import engine, req


def _decoding_engine(n: int = 256):
    eng = engine(kv_blocks=None, max_model_len=8192)
    for i in range(n):
        eng.add(req(f"r{i}", 256, out=5000, seed=i))
    t = 0.0
    while eng.state().num_waiting or any(r.num_output == 0 for r in eng.running()):
        t = eng.step(t).end
    return eng, t


def test_step_speed_256_decoding():
    eng, t = _decoding_engine()
    steps = 1000
    t0 = time.perf_counter()
    for _ in range(steps):
        r = eng.step(t)
        t = r.end
    dt = time.perf_counter() - t0
    assert r.num_decode_tokens == 256
    print(f"\nstep(): {steps / dt:,.0f} steps/s with 256 decoding requests ({dt / steps * 1e6:.0f} us/step)")


def test_advance_speed_256_decoding():
    eng, t = _decoding_engine()
    calls = 50  # stays clear of a full KV cache (then advance() returns 0: the next step preempts)
    t0 = time.perf_counter()
    steps = 0
    for _ in range(calls):
        ms = eng.advance(t, t + 0.5)  # ~20-30 steps per call
        assert ms.steps > 0
        steps += ms.steps
        t = ms.end
    dt = time.perf_counter() - t0
    assert steps > calls
    print(f"\nadvance(): {steps / dt:,.0f} decode steps/s with 256 requests ({steps / calls:.0f} steps per call)")
    assert not math.isnan(t)
