"""Step-time roofline: monotonicity, compute vs memory sides, TP, and consistency with the engine."""

from __future__ import annotations

import pytest
from simhelpers import engine, req

from steersman.sim import Roofline, gpu_profile, model_profile, predict_step

H100 = gpu_profile("H100")
L8 = model_profile("llama-3.1-8b")
L70 = model_profile("llama-3.1-70b")


def test_monotone_in_tokens_and_context():
    roof = Roofline(H100, L8)
    prev = 0.0
    for t in (1, 8, 64, 256, 1024, 4096, 8192):
        d = roof.cost(t, t * t / 2, t, 0, 1)[0]
        assert d > prev
        prev = d
    prev = 0.0
    for ctx in (100, 1000, 10_000, 100_000):
        d = roof.decode_step(64, 64 * ctx)
        assert d > prev
        prev = d


def test_decode_is_memory_bound_and_prefill_compute_bound():
    dec = predict_step(H100, L8, [(1, 1000, True)] * 32)
    assert dec.memory_s > 1.5 * dec.compute_s  # compute includes the GEMM ramp (T0)
    pre = predict_step(H100, L8, [(4096, 0, True)])
    assert pre.compute_s > 3 * pre.memory_s
    # a single decode streams the 16 GB of weights: ~5.5 ms at 3.35 TB/s x bw_eff, plus overheads
    one = predict_step(H100, L8, [(1, 100, True)], step_overhead_s=0.0)
    assert 5e-3 < one.duration < 9e-3


def test_prefill_rate_plausible():
    # ~2 x 8e9 FLOPs/token at ~750 TFLOP/s: a 4096-token prefill of Llama-3.1-8B in ~0.1-0.2 s
    d = predict_step(H100, L8, [(4096, 0, True)]).duration
    assert 0.08 < d < 0.2


def test_faster_gpu_is_faster():
    batch = [(1, 2000, True)] * 64
    a100 = predict_step(gpu_profile("A100"), L8, batch).duration
    h100 = predict_step(H100, L8, batch).duration
    b200 = predict_step(gpu_profile("B200"), L8, batch).duration
    assert a100 > h100 > b200


def test_tensor_parallel_speeds_up_but_adds_allreduce():
    batch = [(1, 1000, True)] * 16
    tp2 = predict_step(gpu_profile("H200"), L70, batch, tp=2, step_overhead_s=0)
    tp4 = predict_step(gpu_profile("H200"), L70, batch, tp=4, step_overhead_s=0)
    tp8 = predict_step(gpu_profile("H200"), L70, batch, tp=8, step_overhead_s=0)
    assert tp2.duration > tp4.duration > tp8.duration
    assert tp4.duration > tp2.duration / 2  # all-reduces and floors do not shrink with tp
    roof1 = Roofline(H100, L8, 1)
    roof2 = Roofline(H100, L8, 2)
    assert roof2._ar[0] > 0 and roof1._ar == (0.0, 0.0)


def test_engine_step_matches_predict_step():
    eng = engine(step_overhead_s=0.003)
    eng.add(req("a", 300, out=5))
    eng.add(req("b", 200, out=5))
    r = eng.step(0.0)
    p = predict_step(H100, L8, [(300, 0, True), (200, 0, True)], step_overhead_s=0.003)
    assert r.duration == pytest.approx(p.duration) and r.compute_s == pytest.approx(p.compute_s)
    r = eng.step(r.end)
    p = predict_step(H100, L8, [(1, 300, True), (1, 200, True)], step_overhead_s=0.003)
    assert r.duration == pytest.approx(p.duration) and r.memory_s == pytest.approx(p.memory_s)
    assert r.duration > r.memory_s > r.compute_s


def test_step_sides_cover_duration():
    r = predict_step(H100, L8, [(512, 1000, False), (1, 500, True)])
    assert max(r.compute_s, r.memory_s) < r.duration
