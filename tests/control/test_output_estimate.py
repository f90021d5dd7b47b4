"""The online output-length estimate per (model, tenant), capped by max_tokens."""

import pytest

from steersman.config import DEFAULTS
from steersman.control.output_estimate import OutputEstimate


def est() -> OutputEstimate:
    return OutputEstimate(DEFAULTS.scheduler.latency_ewma_alpha, DEFAULTS.scheduler.initial_output_estimate)


def test_initial_estimate_before_any_observation_capped_by_max_tokens():
    e = est()
    initial = DEFAULTS.scheduler.initial_output_estimate
    assert e.expected("m") == initial
    assert e.expected("m", "t", max_tokens=4096) == initial  # a limit is not a forecast
    assert e.expected("m", "t", max_tokens=50) == 50


def test_ewma_of_observed_completions():
    e = OutputEstimate(0.5, 211)
    e.observe("m", "t", 100)
    assert e.expected("m", "t") == 100  # the first observation replaces the prior
    e.observe("m", "t", 300)
    assert e.mean("m", "t") == pytest.approx(200.0)
    e.observe("m", "t", 0)  # nothing produced (failed / empty): not evidence of length
    assert e.mean("m", "t") == pytest.approx(200.0)
    assert e.expected("m", "t", max_tokens=4096) == 200
    assert e.expected("m", "t", max_tokens=120) == 120


def test_per_tenant_estimates_with_model_fallback():
    e = OutputEstimate(1.0, 211)
    e.observe("m", "agents", 40)
    e.observe("m", "writers", 900)
    assert e.expected("m", "agents") == 40
    assert e.expected("m", "writers") == 900
    assert e.expected("m", "newcomer") == 900  # the model's latest (alpha 1) over every tenant
    assert e.expected("other-model", "agents") == 211  # models never mix


def test_alpha_converges_toward_a_new_regime():
    e = OutputEstimate(0.2, 211)
    for _ in range(60):
        e.observe("m", "t", 50)
    assert e.expected("m", "t") == 50


def test_bad_parameters_rejected():
    with pytest.raises(ValueError):
        OutputEstimate(0.0, 10)
    with pytest.raises(ValueError):
        OutputEstimate(0.5, 0)


def test_accounting_feeds_the_estimate_from_request_end():
    from steersman.control.accounting import Accounting

    acc = Accounting.__new__(Accounting)  # only the estimate's part of the books
    acc.outputs = est()
    acc.outputs.observe("m", "t", 64)
    assert acc.expected_output("m", "t", 2048) == 64
    assert acc.expected_output("m", "t", None) == 64
