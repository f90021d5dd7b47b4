"""Daily load curves, hourly capacity planning, block hash properties and cross-process determinism."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from steersman.twin.workload import AgentSource, DailyCurve, hourly_offered_load, parse_curve
from steersman.twin.workload.curve import CurveError
from steersman.twin.workload.dists import DistError, parse_dist
from steersman.twin.workload.hashing import block_hashes, mask, name_namespace, positions, source_namespace


def test_sinusoid_peak_trough_and_mean():
    c = DailyCurve.sinusoid(trough=0.2, peak=1.0, peak_hour=14)
    assert c.multiplier(14 * 3600) == pytest.approx(1.0)
    assert c.multiplier(2 * 3600) == pytest.approx(0.2)
    assert c.multiplier(2 * 3600 + 86400 * 3) == pytest.approx(0.2)  # periodic
    assert c.mean() == pytest.approx(0.6, rel=1e-4)
    hours = c.hour_means()
    assert int(np.argmax(hours)) in (13, 14) and int(np.argmin(hours)) in (1, 2)
    shifted = DailyCurve.sinusoid(trough=0.2, peak=1.0, peak_hour=14, start_hour=14)
    assert shifted.multiplier(0.0) == pytest.approx(1.0)  # t = 0 is 14:00
    assert shifted.hour_means() == pytest.approx(hours, rel=1e-6)


def test_hourly_curve_and_inverse():
    vals = [0.3] * 7 + [1.0] * 12 + [0.5] * 5
    step = DailyCurve.hourly(vals, interpolate=False)
    assert step.hour_means() == pytest.approx(vals, rel=1e-3)
    smooth = parse_curve({"hourly": vals, "period_s": 2400, "start_hour": 6})
    assert smooth.period_s == 2400 and smooth.mean() == pytest.approx(np.mean(vals), rel=1e-3)
    t = np.linspace(0, 10_000, 777)
    assert smooth.warp(smooth.cumulative(t)) == pytest.approx(t, abs=1e-6)
    assert smooth.mean(100.0, 100.0 + 2400 * 3) == pytest.approx(smooth.mean(), rel=1e-9)


@pytest.mark.parametrize("bad, message", [
    ({"hourly": [1] * 23}, "24 numbers"),
    ({"hourly": [1] * 24, "shape": 1}, "unknown key"),
    ({"trough": 2, "peak": 1}, "trough <= peak"),
    ({"trough": 0.1, "period_s": 0}, "period_s must be > 0"),
    ({"hourly": [0] * 24}, "> 0 somewhere"),
    ("daily", "expected a mapping"),
])
def test_curve_validation(bad, message):
    with pytest.raises(CurveError, match=message):
        parse_curve(bad)


def test_poisson_tasks_follow_the_curve():
    # a day squeezed into 2400 s (100 s an hour), flat 2/s at the peak hours, 0.5/s at night
    vals = [0.25] * 8 + [1.0] * 8 + [0.25] * 8
    curve = DailyCurve.hourly(vals, interpolate=False, period_s=2400.0)
    w = AgentSource("chatbot", tasks_per_s=20.0, curve=curve, end_s=2400.0, seed=3)
    w.start()
    t = np.array([a.time for a in w.next_batch(1e9)])
    per_hour = np.bincount((t // 100).astype(int), minlength=24)[:24]
    expect = np.array(vals) * 20.0 * 100
    assert np.all(np.abs(per_hour - expect) < 5 * np.sqrt(expect))
    assert per_hour[8:16].sum() / per_hour[:8].sum() == pytest.approx(4.0, rel=0.1)
    loads = hourly_offered_load(w, hour_s=100.0)
    assert [x.tasks_per_s for x in loads] == pytest.approx(list(np.array(vals) * 20.0), rel=1e-3)
    assert w.offered_load().tasks_per_s == pytest.approx(20.0 * np.mean(vals), rel=1e-3)


def test_distribution_specs():
    assert parse_dist(5).mean == 5 and parse_dist([10, 20]).mean == 15
    assert parse_dist({"dist": "lognormal", "mean": 300, "cv": 1.5}).mean == pytest.approx(300)
    assert parse_dist({"dist": "lognormal", "median": 100, "sigma": 0.0}).mean == pytest.approx(100)
    assert parse_dist({"dist": "exponential", "mean": 2, "max": 2}).mean < 2  # clamped
    assert parse_dist({"dist": "choice", "values": [1, 3], "weights": [3, 1]}).mean == pytest.approx(1.5)
    assert parse_dist({"dist": "loguniform", "min": 200, "max": 2000}).mean == pytest.approx(1800 / np.log(10))
    x = parse_dist({"dist": "normal", "mean": 1, "std": 5}).sample(np.random.default_rng(0), 1000)
    assert x.min() >= 0  # normal is clamped at 0 by default
    for bad, msg in [("x", "expected a number"), ([1], r"\[min, max\]"), ({"dist": "uniform", "min": 1}, "missing"),
                     ({"dist": "exponential", "mean": 1, "sd": 2}, "unknown key"), (-3, ">= 0"),
                     ({"dist": "choice", "values": [1, 2], "weights": [1]}, "as long as values")]:
        with pytest.raises(DistError, match=msg):
            parse_dist(bad)


def test_block_hash_namespaces():
    a, b = mask(source_namespace(0, 1)), mask(source_namespace(0, 2))
    ha, hb = block_hashes(a, 0, 5000), block_hashes(b, 0, 5000)
    assert len(set(ha)) == 5000 and set(ha).isdisjoint(hb)
    assert all(-(1 << 63) <= h < (1 << 63) for h in ha + hb)
    assert block_hashes(a, 100, 200) == ha[100:200]  # a block's hash does not depend on how it is computed
    assert name_namespace("sys-v1") == name_namespace("sys-v1") != name_namespace("sys-v2")
    assert name_namespace("x") >= 1 << 63 > source_namespace(1000, 123, 4)
    # well spread in the low bits (the prefix index buckets by them)
    low = np.array(ha) & 0xFF
    assert np.bincount(low, minlength=256).max() < 50
    with pytest.raises(ValueError):
        source_namespace(0, 1 << 32)
    assert positions(10).dtype == np.int64


_DIGEST = """
import hashlib, math
from steersman.twin.workload import AgentSource, TraceSource, Mix
m = Mix([AgentSource("copilot", tasks_per_s=1.0, end_s=20.0, seed=5, name="a"),
          TraceSource(TRACE, limit=50, name="t")])
m.start()
h = hashlib.sha256()
for a in m.next_batch(math.inf):
    h.update(repr((a.time, a.seq, a.prompt_tokens, a.block_hashes, a.output_tokens, a.workflow)).encode())
print(h.hexdigest())
"""


def test_same_arrivals_in_every_process(shared_dir):
    """Hashes never use str hashing: PYTHONHASHSEED must not change anything."""
    code = _DIGEST.replace("TRACE", repr(str(shared_dir / "traces" / "mooncake-synthetic.jsonl")))
    out = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)
    assert len(out) == 1 and len(out.pop().strip()) == 64
