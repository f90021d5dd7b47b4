"""Weights: cold -> loading -> warm, and unloading."""

from __future__ import annotations

import pytest
from simhelpers import engine, req, run

from steersman.sim import WeightsState, model_profile


def test_cold_loading_warm_timing():
    eng = engine(warm=False, weight_load_gbps=2.0)
    assert eng.weights is WeightsState.COLD
    eng.add(req("a", 30, out=3))  # requests may queue while cold
    assert eng.has_work() and eng.step(1.0) is None and eng.next_event_time(1.0) is None
    load_s = model_profile("llama-3.1-8b").weight_bytes / 2e9
    ready = eng.begin_load(10.0)
    assert ready == pytest.approx(10.0 + load_s) and load_s == pytest.approx(8.03, abs=0.01)
    assert eng.begin_load(11.0) == ready  # already loading: unchanged
    assert eng.weights is WeightsState.LOADING and eng.state().weights_ready_at == ready
    assert eng.next_event_time(12.0) == ready
    assert eng.step(ready - 1e-6) is None
    r = eng.step(ready)
    assert r is not None and r.start == ready and eng.weights is WeightsState.WARM
    assert eng.state(ready).weights is WeightsState.WARM


def test_state_resolves_load_with_now():
    eng = engine(warm=False)
    ready = eng.begin_load(0.0)
    assert eng.state().weights is WeightsState.LOADING
    assert eng.state(ready + 1).weights is WeightsState.WARM


def test_tp_loads_a_shard_per_gpu():
    one = engine(warm=False, kv_blocks=None, model="llama-3.1-70b", gpu="H200", tensor_parallel=2)
    four = engine(warm=False, kv_blocks=None, model="llama-3.1-70b", gpu="H200", tensor_parallel=4)
    assert one.begin_load(0.0) == pytest.approx(2 * four.begin_load(0.0))


def test_unload_requeues_running_and_drops_cache():
    eng = engine()
    eng.add(req("a", 40, out=10))
    eng.add(req("b", 40, out=10))
    r = eng.step(0.0)
    r = eng.step(r.end)
    eng.unload()
    st = eng.state()
    assert st.weights is WeightsState.COLD and st.kv_blocks_used == 0 and st.num_running == 0
    assert st.num_waiting == 2 and [q.req_id for q in eng.waiting()] == ["a", "b"]
    assert eng.kv.num_cached == 0
    ready = eng.begin_load(r.end)
    results = run(eng, ready)
    assert eng.request("a").num_output == 10 and eng.request("b").num_output == 10
    assert results[0].num_prefill_tokens == 2 * (40 + 2)  # recompute prompt + 2 generated each
