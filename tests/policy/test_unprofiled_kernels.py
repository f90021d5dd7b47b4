"""The compiled unprofiled model (``steersman.policy.unprofiled_kernels``) against the numpy code it replaced.

The reference below is that numpy code, unchanged: a decision must come out bit for bit the same, NaNs
(replicas never scraped, no timing read yet) included.  Random fleets mix replicas with and without a
roofline, several classes of alike replicas, idle and busy ones, prices and stalls.
"""

import dataclasses

import numpy as np
import pytest

from steersman.config import DEFAULTS
from steersman.fleet import snapshot as S
from steersman.fleet.statics import ReplicaSpec, build_statics
from steersman.policy import predict as P
from steersman.testing.snapshots import MODEL, fleet_snapshot

SCHED = DEFAULTS.scheduler


# --- the numpy reference (steersman.policy.predict before the kernels) ---------------------------------------

def _ref_decode_step(live, i):
    measured = live[S.DECODE_S_TOKEN, i]
    return np.where(measured > 0.0, measured, SCHED.unprofiled_decode_step_s)


def _ref_speeds(snap, i):
    live = snap.live
    measured = live[S.PREFILL_S_TOKEN, i]
    s_tok = np.where(measured > 0.0, measured, SCHED.unprofiled_prefill_s_per_token)
    r_ttft = live[S.TTFT_RATIO, i]
    return s_tok, _ref_decode_step(live, i), np.where(np.isnan(r_ttft), snap.ttft_prior, r_ttft)


def _ref_own_tpot(snap, i):
    live = snap.live
    r_tpot = live[S.TPOT_RATIO, i]
    idle = (live[S.IN_FLIGHT, i] <= 0.0) & ~(live[S.RUNNING, i] > 0.0)
    return _ref_decode_step(live, i) * np.where(np.isnan(r_tpot) | idle, snap.tpot_prior, r_tpot)


def _ref_pooled_all(snap, spread):
    st = snap.statics
    u = np.flatnonzero(~st.modelled)
    if spread <= 1.0 or u.size < 2:
        return None
    every = _ref_own_tpot(snap, u)
    measured = snap.live[S.DECODE_S_TOKEN, u] > 0.0
    c = st.speed_class[u]
    w = measured.astype(float)
    size = int(c.max()) + 1
    others_n = np.bincount(c, weights=w, minlength=size)[c] - w
    others = (np.bincount(c, weights=every * w, minlength=size)[c] - every * w) / np.maximum(others_n, 1.0)
    agree = measured & ((others_n == 0) | ((every <= spread * others) & (others <= spread * every)))
    k = np.bincount(c, weights=agree, minlength=size)[c]
    mean = np.bincount(c, weights=np.where(agree, every, 0.0), minlength=size)[c] / np.maximum(k, 1.0)
    full = np.full(st.speed_class.size, np.nan)
    full[u] = np.where(agree | (~measured & (k > 0)), mean, every)
    own = np.full(st.speed_class.size, np.nan)
    own[u] = every
    return full, own


def _nan0(x):
    return np.where(np.isnan(x), 0.0, x)


def _ref_unprofiled(snap, idx, own, prompt_tokens, expected_output, out, spread):
    st = snap.statics
    u = np.flatnonzero(~st.modelled[idx])
    if u.size == 0:
        return
    i = idx[u]
    live = snap.live
    s_tok, step, r_ttft = _ref_speeds(snap, i)
    ours_waiting = np.maximum(live[S.IN_FLIGHT, i] - live[S.DECODING, i], 0.0)
    others = np.maximum(live[S.WAITING, i] - ours_waiting, 0.0) * prompt_tokens
    work = np.maximum(live[S.PENDING_PREFILL, i], 0.0) + _nan0(others) + own[u]
    stalled = _nan0(snap.time - live[S.STALLED_SINCE, i])  # the hang floor, on the TTFT alone too
    ttft = np.maximum((step + work * s_tok) * r_ttft, stalled)
    both = _ref_pooled_all(snap, spread)
    tpot = _ref_own_tpot(snap, i) if both is None else both[0][i]
    out[0, u] = ttft
    out[1, u] = tpot
    out[4, u] = tpot
    out[5, u] = np.maximum((step + own[u] * s_tok) * r_ttft, stalled)
    out[2, u] = ttft + expected_output * tpot
    price = _nan0(st.price_per_hour[i])
    out[3, u] = price * (own[u] * s_tok * r_ttft + expected_output / P.REFERENCE_BATCH * tpot) / 3600.0


# --- random fleets ----------------------------------------------------------------------------------------------

def _maybe_nan(rng, values, share=0.2):
    return np.where(rng.random(values.size) < share, np.nan, values)


def _random_snapshot(rng):
    n = int(rng.integers(1, 9))
    specs = []
    for _ in range(n):
        if rng.random() < 0.25:
            specs.append(ReplicaSpec("H100", MODEL, 1, 3.0))  # has a roofline: left alone
        else:
            specs.append(ReplicaSpec(None, MODEL, 1, float(rng.choice([0.0, 0.0, 1.5])), kind="llamacpp",
                                     pool=str(rng.choice(["a", "b", "c"]))))
    busy = rng.random(n) < 0.6
    snap = fleet_snapshot(
        n, time=100.0,
        in_flight=np.where(busy, rng.integers(0, 5, n), 0).astype(float),
        running=_maybe_nan(rng, np.where(busy, rng.integers(0, 5, n), 0).astype(float)),
        decoding=rng.integers(0, 3, n).astype(float),
        waiting=_maybe_nan(rng, rng.integers(0, 4, n).astype(float)),
        pending_prefill=rng.integers(-5, 800, n).astype(float),
        stalled_since=_maybe_nan(rng, 100.0 - rng.random(n) * 3, 0.7),
        ttft_ratio=_maybe_nan(rng, rng.uniform(0.3, 5.0, n)),
        tpot_ratio=_maybe_nan(rng, rng.uniform(0.3, 30.0, n)),
        prefill_s_token=_maybe_nan(rng, np.where(rng.random(n) < 0.2, 0.0, rng.uniform(1e-4, 1e-2, n))),
        decode_s_token=_maybe_nan(rng, np.where(rng.random(n) < 0.2, 0.0, rng.uniform(5e-3, 0.1, n))),
    )
    snap = dataclasses.replace(snap, statics=build_statics(specs))
    object.__setattr__(snap, "ttft_prior", float(rng.uniform(0.5, 2.0)))
    object.__setattr__(snap, "tpot_prior", float(rng.uniform(0.5, 2.0)))
    return snap


def _with_spread(spread):
    object.__setattr__(DEFAULTS, "scheduler", dataclasses.replace(SCHED, unprofiled_tpot_pool_spread=spread))


@pytest.fixture
def restore_scheduler():
    yield
    object.__setattr__(DEFAULTS, "scheduler", SCHED)


@pytest.mark.parametrize("spread", [SCHED.unprofiled_tpot_pool_spread, 2.0, 1.0])
def test_compiled_unprofiled_model_is_bit_identical_to_the_numpy_one(spread, restore_scheduler):
    _with_spread(spread)
    rng = np.random.default_rng(int(spread * 1000))
    pooled_some = 0
    for _ in range(400):
        snap = _random_snapshot(rng)
        n = snap.live.shape[1]
        idx = np.sort(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False)).astype(np.intp)
        own = rng.integers(1, 2000, idx.size).astype(float)
        pt, eo = float(own.max() + rng.integers(0, 50)), float(rng.integers(1, 300))
        start = rng.random((6, idx.size))
        got, want = start.copy(), start.copy()
        P._unprofiled(snap, idx, own, pt, eo, got)
        _ref_unprofiled(snap, idx, own, pt, eo, want, spread)
        np.testing.assert_array_equal(got, want)  # every column, bit for bit (NaN == NaN); modelled ones untouched
        ref = _ref_pooled_all(snap, spread)
        new = P._pooled_all(snap)
        assert (ref is None) == (new is None)
        if ref is not None:
            pooled_some += 1
            np.testing.assert_array_equal(new[0], ref[0])
            np.testing.assert_array_equal(new[1], ref[1])
        every = np.arange(n)
        for a, b in zip(P.unprofiled_speeds(snap, every), _ref_speeds(snap, every)):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(P._own_tpot(snap, every), _ref_own_tpot(snap, every))
    assert (pooled_some > 100) == (spread > 1.0)  # the cases exercised pooling (and none when it is off)
