"""A request of ``n`` samples decodes as n sequences side by side (vLLM): the scheduler counts them in the batch
its TPOT is predicted for, in its cost, in the KV it will hold and in the tokens it reserves."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
from replayscenarios import describe, random_cases

from steersman.policy import make_policy
from steersman.policy.base import Route
from steersman.policy.predict import predict

from test_kv_shortfall import _req, _snap

CASES = list(itertools.islice(random_cases(), 600))


def test_the_fused_path_and_the_plugins_agree_on_many_sample_requests():
    policy = make_policy("steersman")
    diff = []
    for snap, req in CASES:
        r = replace(req, samples=4)
        fast, slow = describe(policy.pick(snap, r)), describe(policy.decide(policy.context(snap, r)))
        if fast != slow:
            diff.append((fast, slow))
    assert not diff, diff[:2]


def test_samples_join_the_batch_and_the_bill():
    snap = _snap([30_000.0, 30_000.0], [0.1, 0.1])
    policy = make_policy("steersman")
    one, eight = _req(500, 200), replace(_req(500, 200), samples=8)
    p1 = predict(policy.context(snap, one))
    p8 = predict(policy.context(snap, eight))
    assert np.all(p8.tpot > p1.tpot)  # eight more sequences in the batch decode slower than one
    assert np.all(p8.cost > 4 * p1.cost)  # each sample's decode is paid for
    assert np.all(p8.ttft == p1.ttft)  # the prompt is computed once
    assert eight.kv_tokens == 500 + 8 * 200 and one.kv_tokens == 700


def test_the_kv_of_every_sample_must_fit():
    # 16,000 tokens of cache, 10,000 free on replica 0, 15,000 on replica 1
    snap = _snap([1000.0, 1000.0], [0.375, 0.0625])
    policy = make_policy("steersman")
    r = replace(_req(2_000, 1_500), samples=6)  # 11,000 tokens: only replica 1 holds it now
    d = policy.pick(snap, r)
    assert isinstance(d, Route) and d.replica == 1
    assert describe(d) == describe(policy.decide(policy.context(snap, r)))


def test_admission_reserves_and_accounting_counts_every_sample():
    from steersman.config import DEFAULTS
    from steersman.control.admission import Admit, DefaultAdmitter
    from steersman.control.tenants import TenantConfig
    from steersman.policy.request import PriorityClass

    tenant = TenantConfig("t", PriorityClass.STANDARD, tokens_per_minute=10_000)
    adm = DefaultAdmitter(DEFAULTS.admission)
    r = replace(_req(1_000, 1_000), samples=6)  # 7,000 tokens of the minute's 10,000
    assert isinstance(adm.admit(r, tenant, 0.0), Admit)
    assert not isinstance(adm.admit(r, tenant, 0.0), Admit)  # another 7,000 does not fit the minute


def test_a_batch_of_prompts_counts_as_a_sequence_per_prompt_and_sample():
    import msgspec

    from steersman.api.schema import ChatCompletionRequest, CompletionRequest
    from steersman.pipeline.admit import _batch

    def comp(prompt):
        return msgspec.convert({"model": "m", "prompt": prompt}, CompletionRequest)

    assert _batch(comp("x")) == 1 and _batch(comp([1, 2, 3])) == 1  # a string, one prompt of token ids
    assert _batch(comp(["a", "b", "c"])) == 3 and _batch(comp([[1], [2, 3]])) == 2
    assert _batch(msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "x"}]},
                                  ChatCompletionRequest)) == 1
