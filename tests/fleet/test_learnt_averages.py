"""The fleet's learnt averages (observed latencies, observed/predicted ratios) weigh observations by time."""

import math
from dataclasses import replace

import numpy as np
import pytest

from steersman.config import DEFAULTS
from steersman.fleet import snapshot as S
from steersman.fleet.state import Fleet, Replica
from steersman.testing import FakeClock


def _fleet(tau: float) -> tuple[Fleet, FakeClock]:
    clock = FakeClock()
    rep = Replica(0, "r0", "http://127.0.0.1:1", "vllm", "H100", ("llama-3.1-8b",), "p", 2.0, 1, None)
    return Fleet([rep], clock, replace(DEFAULTS.scheduler, latency_ewma_tau_s=tau)), clock


def _observe(fleet: Fleet, clock: FakeClock, ratio: float, n: int = 1) -> None:
    """``n`` requests whose first token came ``ratio`` x later than predicted, all at the clock's now."""
    tickets = []
    for _ in range(n):
        tickets.append(fleet.begin(0, 100, 10, predicted_ttft=0.1))
    clock.set(clock.now() + 0.1 * ratio)  # the tickets' TTFT
    for t in tickets:
        fleet.first_token(t)
        fleet.end(t, 1)


def test_a_burst_of_observations_moves_the_average_as_one_and_time_restores_the_weight():
    fleet, clock = _fleet(DEFAULTS.scheduler.latency_ewma_tau_s)
    _observe(fleet, clock, 1.0)  # the first observation is the average
    assert fleet.live[S.TTFT_RATIO, 0] == pytest.approx(1.0)
    _observe(fleet, clock, 2.0, n=200)  # 200 at one instant, 0.2 s after the first: a time average barely moves
    w = 1 - math.exp(-0.2 / 1.0)
    assert fleet.live[S.TTFT_RATIO, 0] == pytest.approx(1.0 + w * (2.0 - 1.0))
    assert fleet.ratio_prior[S.TTFT_RATIO] == pytest.approx(1.0 + w * (2.0 - 1.0))  # the fleet-wide prior too
    before = fleet.live[S.TTFT_RATIO, 0]
    clock.set(clock.now() + 10.0)  # a quiet spell: the next one weighs latency_ewma_alpha, no more
    _observe(fleet, clock, 2.0)
    a = DEFAULTS.scheduler.latency_ewma_alpha
    assert fleet.live[S.TTFT_RATIO, 0] == pytest.approx(before + a * (2.0 - before))


def test_tau_zero_is_the_fixed_weight_per_observation():
    fleet, clock = _fleet(0.0)
    _observe(fleet, clock, 1.0)
    _observe(fleet, clock, 2.0, n=200)
    assert fleet.live[S.TTFT_RATIO, 0] == pytest.approx(2.0, rel=1e-6)  # 0.8 ** 200 of the first is left
    assert np.isfinite(fleet.live[S.TTFT_EWMA, 0])


def test_a_negative_time_constant_is_refused():
    with pytest.raises(ValueError, match="latency_ewma_tau_s must be >= 0"):
        replace(DEFAULTS.scheduler, latency_ewma_tau_s=-1.0)
