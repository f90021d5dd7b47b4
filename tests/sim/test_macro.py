"""advance(): closed-form runs of decode steps leave the engine where a step() loop would."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simhelpers import BS, engine, req, tokens

from steersman.sim import SimRequest
from steersman.text.tokenizer import block_hashes


def snapshot(eng):
    """(exact state, float times): the times may differ by float rounding only."""
    reqs = {}
    times = []
    for rid in sorted(eng._live) + sorted(eng._done):
        r = eng.request(rid)
        reqs[rid] = (
            r.status, r.num_computed, r.num_output, tuple(r.blocks), r.num_hashed, len(r.out_hashes),
            r.num_preemptions, r.first_token_at is None, r.finished_at is None,
        )
        times.append(r.finished_at or 0.0)
    st_ = eng.state()
    return (
        reqs,
        [r.req_id for r in eng.running()],
        [r.req_id for r in eng.waiting()],
        eng.kv.free_queue(),
        eng.kv.ref_counts(),
        st_.num_steps, st_.generation_tokens_total, st_.prompt_tokens_total, st_.num_preemptions,
        st_.prefix_queries, st_.prefix_hits, st_.kv_blocks_used,
    ), times + [st_.busy_until]


def same(a, b):
    (sa, ta), (sb, tb) = snapshot(a), snapshot(b)
    assert sa == sb
    assert ta == pytest.approx(tb, rel=1e-9, abs=1e-12)


def build(spec, kv_blocks, policy, max_seqs, hashing):
    eng = engine(kv_blocks=kv_blocks, scheduling_policy=policy, max_num_seqs=max_seqs, max_num_batched_tokens=256)
    for i, (prefix, own, out, prio) in enumerate(spec):
        prompt = tokens(1, prefix) + tokens(100 + i, own)
        kw = {}
        if hashing:
            output = tokens(500 + i % 3, out)  # some requests generate the same text
            kw = dict(output_token_ids=lambda n, o=output: o[:n], prompt_tail=prompt[len(prompt) // BS * BS :])
        r = SimRequest(f"r{i}", len(prompt), out, block_hashes(prompt, BS), priority=prio, arrival=i * 1e-3, **kw)
        eng.add(r)
    return eng


request_spec = st.tuples(
    st.sampled_from([0, 16, 40, 64]), st.integers(1, 120), st.integers(1, 150), st.integers(0, 3)
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=st.lists(request_spec, min_size=1, max_size=10),
    kv_blocks=st.integers(30, 200),
    policy=st.sampled_from(["fcfs", "priority"]),
    max_seqs=st.integers(1, 8),
    hashing=st.booleans(),
    warmup=st.integers(0, 40),
    span=st.one_of(st.just(math.inf), st.floats(0.0, 3.0)),
)
def test_advance_equals_step_loop(spec, kv_blocks, policy, max_seqs, hashing, warmup, span):
    a = build(spec, kv_blocks, policy, max_seqs, hashing)
    b = build(spec, kv_blocks, policy, max_seqs, hashing)
    t = 0.0
    for _ in range(warmup):
        if not a.has_work():
            break
        ra, rb = a.step(t), b.step(t)
        assert ra.end == rb.end
        t = ra.end
    until = t + span
    while True:  # macro-steps interleaved with plain steps, as the twin would drive it
        ms = a.advance(t, until)
        for _ in range(ms.steps):
            r = b.step(t)
            assert r.num_decode_tokens == r.num_seqs == ms.num_seqs and r.num_prefill_tokens == 0
            assert not r.preempted
            t = r.end
        if ms.steps:
            assert ms.end == pytest.approx(t, rel=1e-9, abs=1e-9)
            same(a, b)
            nxt = b.next_event_time(t)
            # maximal: stopped by `until`, a finish, or a step that is not a plain decode step
            if nxt is not None and nxt < until and not ms.finished:
                r = b.step(t)
                a.step(t)
                assert r.preempted or r.num_prefill_tokens or r.num_seqs != ms.num_seqs
                t = r.end
                continue
        if not a.has_work() or t >= until:
            break
        ra, rb = a.step(t), b.step(t)
        if ra is None:
            break
        assert ra.end == pytest.approx(rb.end, rel=1e-9) and ra.outputs == rb.outputs
        t = ra.end
    same(a, b)


def test_advance_runs_until_first_finish_in_closed_form():
    eng = engine()
    for i, out in enumerate((50, 80, 30)):
        eng.add(req(f"r{i}", 100 + 10 * i, out=out))
    r = eng.step(0.0)
    ms = eng.advance(r.end, math.inf)
    assert ms.steps == 29 and ms.finished == ["r2"]  # r2 had 1 token, finishes at 30
    assert dict(ms.outputs) == {"r0": 30, "r1": 30, "r2": 30}
    assert ms.end == pytest.approx(
        r.end + ms.steps * ms.first_duration + ms.duration_slope * ms.steps * (ms.steps - 1) / 2
    )
    assert ms.duration_slope > 0 and eng.state().num_running == 2
    assert eng.request("r2").finished_at == ms.end


def test_advance_respects_until_and_returns_zero_when_not_uniform():
    eng = engine()
    eng.add(req("a", 100, out=500))
    assert eng.advance(0.0, math.inf).steps == 0  # prefill pending
    r = eng.step(0.0)
    ms = eng.advance(r.end, r.end + 0.1)
    assert ms.steps > 0 and ms.end - ms.first_duration - ms.duration_slope * (ms.steps - 1) < r.end + 0.1 <= ms.end
    eng.add(req("b", 100, out=5))
    assert eng.advance(ms.end, math.inf).steps == 0  # b can be admitted: composition changes
    assert eng.advance(ms.end, ms.end).steps == 0  # nothing starts before `until`


def test_advance_stops_before_preemption():
    eng = engine(kv_blocks=20)
    eng.add(req("a", 64, out=200, seed=1))
    eng.add(req("b", 64, out=200, seed=2))
    r = eng.step(0.0)
    ms = eng.advance(r.end, math.inf)
    assert ms.steps > 0 and eng.state().num_preemptions == 0
    assert eng.step(ms.end).preempted == ["b"]
