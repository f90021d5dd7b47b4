"""FastHistogram: a NaN observation is dropped, and an inf bound does not give a second +Inf bucket."""

import math

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from steersman.obs.histogram import FastHistogram, HistogramFamily


def test_a_nan_observation_counts_in_no_bucket_and_leaves_the_sum_usable():
    h = FastHistogram([0.1, 0.5, 1.0])
    for v in (0.7, math.nan, 0.7):
        h.observe(v)
    assert h.cumulative() == [("0.1", 0.0), ("0.5", 0.0), ("1.0", 2.0), ("+Inf", 2.0)]
    assert h.count == 2 and h.sum == 1.4
    # the buckets as prometheus_client's (which leaves the NaN out of them too, but keeps it in its sum)
    reg = CollectorRegistry()
    ref = Histogram("x", "x", buckets=[0.1, 0.5, 1.0], registry=reg)
    for v in (0.7, math.nan, 0.7):
        ref.observe(v)
    ref_buckets = [(s.labels["le"], s.value) for f in text_string_to_metric_families(generate_latest(reg).decode())
                   for s in f.samples if s.name == "x_bucket"]
    assert h.cumulative() == ref_buckets


def test_an_inf_bound_is_the_plus_inf_bucket_once():
    fam = HistogramFamily("y", "y", [], [0.1, math.inf])
    fam.labels().observe(5.0)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(fam)
    samples = [s for f in text_string_to_metric_families(generate_latest(reg).decode()) for s in f.samples]
    les = [s.labels["le"] for s in samples if s.name == "y_bucket"]
    assert les == ["0.1", "+Inf"]
    assert [s.value for s in samples if s.name in ("y_count", "y_sum")] == [1.0, 5.0]
