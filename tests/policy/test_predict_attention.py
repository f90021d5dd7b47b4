"""The TTFT prediction counts the attention work of the prefill queued ahead at the context it attends to.

A chunk of a long prompt attends to every token before it, so 40,000 queued tokens of one prompt take far longer
to prefill than 40,000 tokens of forty short prompts.  The fleet keeps the attention work of its pending prefill
(``pending_pairs``: (L^2 - h^2) / 2 token pairs per prompt of L tokens with h cached); the prediction prices the
queue's steps at their mean chunk offset.  Checked against the engine model the twin runs (``steersman.sim``).
"""

from __future__ import annotations

import dataclasses

import pytest

from steersman.config import DEFAULTS
from steersman.fleet.records import attention_pairs
from steersman.policy import make_policy
from steersman.policy.base import Route
from steersman.sim import EngineModel, SimRequest, gpu_profile, model_profile
from steersman.testing.snapshots import fleet_snapshot, sched_request
from steersman.text.tokenizer import block_hashes

QUEUED = 40_000
_NO_SATURATION = dataclasses.replace(DEFAULTS.scheduler, saturation_queue_depth=1_000_000)


def _engine_ttft(prompts: list[int]) -> float:
    """The newcomer's (16 tokens) TTFT on an idle H100 after ``prompts`` (lengths) were queued just before it."""
    settings = dataclasses.replace(DEFAULTS.engine, max_model_len=65_536)
    eng = EngineModel(gpu_profile("H100"), model_profile("llama-3.1-8b"), settings, warm=True)
    for k, n in enumerate(prompts):
        toks = [k * 1_000_003 + i for i in range(n)]
        eng.add(SimRequest(f"q{k}", n, 1, block_hashes(toks, 16)))
    eng.add(SimRequest("new", 16, 1, block_hashes([7] * 16, 16)))
    t = 0.0
    while eng.has_work():
        r = eng.step(t)
        t = r.end
        if "new" in r.first_tokens:
            return t
    raise AssertionError("the newcomer never started")


def _predicted_ttft(prompts: list[int]) -> float:
    k = len(prompts)
    # ours, routed since the last scrape (which saw an idle engine: not saturated)
    snap = fleet_snapshot(["H100"], in_flight=k, waiting=0, running=0, decoding=0, pending_prefill=sum(prompts),
                          pending_pairs=sum(attention_pairs(n, n) for n in prompts))
    # the prediction, not the saturation detector (forty prompts past a step's token budget wait: saturated)
    d = make_policy("steersman", _NO_SATURATION).pick(snap, sched_request(prompt_tokens=16, expected_output=1))
    assert isinstance(d, Route)
    return d.predicted_ttft_s


@pytest.mark.parametrize("prompts", [[QUEUED], [1_000] * 40, [20_000, 10_000, 10_000]])
def test_the_prediction_follows_the_engine_model(prompts):
    engine, predicted = _engine_ttft(prompts), _predicted_ttft(prompts)
    assert predicted == pytest.approx(engine, rel=0.2), (predicted, engine)


def test_one_long_prompt_ahead_delays_more_than_as_many_tokens_of_short_ones():
    long, short = _predicted_ttft([QUEUED]), _predicted_ttft([1_000] * 40)
    assert long > 1.3 * short
    assert _engine_ttft([QUEUED]) > 1.3 * _engine_ttft([1_000] * 40)  # the engine model agrees


def test_attention_pairs():
    assert attention_pairs(100, 100) == 5_000.0
    assert attention_pairs(100, 0) == 0.0
    assert attention_pairs(100, 10) == (100**2 - 90**2) / 2
    big = attention_pairs(191_378, 191_378)  # Mooncake's longest prompt: exact in a float64
    assert big - attention_pairs(191_378, 191_378) == 0.0 and big == int(big) + 0.5 * (191_378**2 % 2)
