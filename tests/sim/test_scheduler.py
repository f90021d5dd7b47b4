"""Continuous batching as vLLM v1 schedules it: budget, chunking, seqs, prefix cache, preemption."""

from __future__ import annotations

import pytest
from simhelpers import BS, engine, expected_blocks, req, run, tokens

from steersman.sim import SimRequest


def test_budget_and_order_running_first():
    eng = engine(max_num_batched_tokens=100)
    for rid, n in (("a", 60), ("b", 60), ("c", 10)):
        eng.add(req(rid, n, out=3))
    r1 = eng.step(0.0)
    assert r1.num_prefill_tokens == 100 and r1.num_seqs == 2  # a: 60, b: first 40; c waits
    assert r1.outputs == [("a", 1)]
    assert eng.request("b").num_computed == 40 and eng.request("c").num_computed == 0
    r2 = eng.step(r1.end)
    assert r2.start == r1.end
    # running first in admission order: a decodes (1), b finishes its prompt (20), then c (10)
    assert (r2.num_decode_tokens, r2.num_prefill_tokens, r2.num_seqs) == (1, 30, 3)
    assert r2.outputs == [("a", 2), ("b", 1), ("c", 1)]


def test_chunked_prefill_across_steps():
    eng = engine(max_num_batched_tokens=100)
    eng.add(req("a", 250, out=2))
    computed = []
    t = 0.0
    while eng.has_work():
        r = eng.step(t)
        t = r.end
        computed.append(eng.request("a").num_computed)
        if len(computed) < 3:
            assert r.outputs == [] and r.num_prefill_tokens == 100  # no token until the prompt is done
    assert computed == [100, 200, 250, 251]
    a = eng.request("a")
    assert a.first_token_at is not None and a.finished_at > a.first_token_at


def test_chunked_prefill_disabled_blocks_admission():
    eng = engine(max_num_batched_tokens=100, enable_chunked_prefill=False, max_model_len=100)
    eng.add(req("a", 40, out=10))
    eng.add(req("b", 70, out=10))
    r = eng.step(0.0)
    assert r.num_prefill_tokens == 40  # b's 70 do not fit the 60 left: admission stops
    r = eng.step(r.end)
    assert (r.num_decode_tokens, r.num_prefill_tokens) == (1, 70)
    with pytest.raises(ValueError):
        eng.add(req("c", 95, out=10))


def test_max_num_seqs():
    eng = engine(max_num_seqs=2)
    for rid in "abc":
        eng.add(req(rid, 20, out=3))
    r = eng.step(0.0)
    assert r.num_seqs == 2 and eng.state().num_waiting == 1
    r = eng.step(r.end)
    r = eng.step(r.end)
    assert sorted(r.finished) == ["a", "b"]
    r = eng.step(r.end)
    assert r.num_seqs == 1 and r.outputs == [("c", 1)]


def test_block_accounting_every_step_and_all_freed():
    eng = engine(kv_blocks=200, max_num_batched_tokens=64)
    shared = tokens(1, 48)
    for i in range(6):
        eng.add(req(f"r{i}", shared + tokens(10 + i, 5 + 7 * i), out=20 + i))
    t = 0.0
    while eng.has_work():
        r = eng.step(t)
        t = r.end
        st = eng.state()
        assert st.kv_blocks_used == expected_blocks(eng)
        assert st.kv_usage == pytest.approx(st.kv_blocks_used / st.kv_blocks_total)
    st = eng.state()
    assert st.kv_blocks_used == 0 and st.num_running == 0 and st.num_waiting == 0


def test_finish_emits_tokens_and_counts():
    eng = engine()
    eng.add(req("a", 30, out=5))
    results = run(eng)
    outs = [o for r in results for o in r.outputs]
    assert outs == [("a", k) for k in range(1, 6)]
    assert results[-1].finished == ["a"]
    a = eng.request("a")
    assert a.status == "finished" and a.num_output == 5 and a.finished_at == results[-1].end
    assert a.first_token_at == results[0].end and a.first_scheduled_at == 0.0
    st = eng.state()
    assert st.prompt_tokens_total == 30 and st.generation_tokens_total == 5 and st.num_steps == 5


def test_abort_frees_wherever_it_is():
    eng = engine(max_num_seqs=1)
    eng.add(req("a", 40, out=50))
    eng.add(req("b", 40, out=50))
    r = eng.step(0.0)
    assert eng.state().kv_blocks_used == 3
    assert eng.abort("b")  # waiting
    assert eng.abort("a")  # running
    assert not eng.abort("a") and not eng.abort("zzz")
    st = eng.state()
    assert st.kv_blocks_used == 0 and st.num_running == 0 and st.num_waiting == 0
    assert not eng.has_work() and eng.step(r.end) is None and eng.next_event_time(r.end) is None
    assert eng.request("a").status == "aborted" and eng.request("b").status == "aborted"


def test_prefix_hit_skips_cached_tokens_and_counts_tokens():
    eng = engine()
    shared = tokens(1, 100)  # 6 full blocks
    eng.add(req("a", shared + tokens(2, 20), out=2))
    r = eng.step(0.0)
    assert r.num_prefill_tokens == 120
    eng.add(req("b", shared + tokens(3, 30), out=2))
    r = eng.step(r.end)
    b = eng.request("b")
    assert b.num_cached_tokens == 96
    assert r.num_prefill_tokens == 130 - 96 and r.num_decode_tokens == 1
    st = eng.state()
    assert st.prefix_queries == 120 + 130 and st.prefix_hits == 96


def test_same_step_prefix_sharing():
    """vLLM caches a block when it is scheduled, so a request admitted later in the same step hits it."""
    eng = engine()
    p = tokens(1, 64)
    eng.add(req("a", p + [1], out=2))
    eng.add(req("b", p + [2], out=2))
    r = eng.step(0.0)
    assert r.num_prefill_tokens == 65 + 1
    assert eng.request("b").num_cached_tokens == 64


def test_preemption_under_kv_pressure_and_recompute():
    # 10 blocks; each request: 64-token prompt (4 blocks) growing to 64 + 40 - 1 tokens (7 blocks)
    eng = engine(kv_blocks=10)
    eng.add(req("a", 64, out=40, seed=1))
    eng.add(req("b", 64, out=40, seed=2))
    results = run(eng)
    preempted = [(i, r.preempted) for i, r in enumerate(results) if r.preempted]
    assert preempted and preempted[0][1] == ["b"]  # FCFS: the last admitted goes
    i = preempted[0][0]
    assert results[i].num_seqs == 1  # nothing admitted in a step that preempted
    st = eng.state()
    assert st.num_preemptions >= 1 and eng.request("b").num_preemptions >= 1
    assert eng.request("a").num_output == 40 and eng.request("b").num_output == 40
    assert st.kv_blocks_used == 0
    # b's resume re-prefills prompt + the tokens it had generated (minus cache hits)
    b_out = [dict(r.outputs).get("b") for r in results]
    before = max(o for o in b_out[: i + 1] if o is not None)
    resume = next(r for r in results[i + 1 :] if any(rid == "b" for rid, _ in r.outputs))
    assert dict(resume.outputs)["b"] == before + 1
    assert st.prefix_queries >= 64 + 64 + 64 + before  # re-queried on resume, in tokens


def test_recompute_hits_own_cached_prompt_blocks():
    eng = engine(kv_blocks=12)
    eng.add(req("a", 64, out=60, seed=1))
    eng.add(req("b", 64, out=40, seed=2))
    results = run(eng)
    assert [v for r in results for v in r.preempted] == ["b"]
    # b's freed uncached tail blocks were taken first; its 4 prompt blocks stayed cached
    assert eng.request("b").num_cached_tokens == 0  # first scheduling: nothing cached
    assert eng.state().prefix_hits == 64


def test_priority_order_and_victim():
    eng = engine(scheduling_policy="priority", max_num_seqs=1)
    eng.add(req("low", 20, out=2, priority=5, arrival=0.0))
    eng.add(req("high", 20, out=2, priority=0, arrival=1.0))
    eng.add(req("high2", 20, out=2, priority=0, arrival=2.0))
    order = [r.outputs[0][0] for r in run(eng) if r.outputs and r.outputs[0][1] == 1]
    assert order == ["high", "high2", "low"]

    eng = engine(scheduling_policy="priority", kv_blocks=12)
    eng.add(req("a", 64, out=60, priority=0, seed=1))
    eng.add(req("b", 64, out=60, priority=9, seed=2, arrival=1.0))
    eng.add(req("c", 32, out=60, priority=1, seed=3, arrival=2.0))
    victims = [v for r in run(eng) for v in r.preempted]
    assert victims and victims[0] == "b"  # max (priority, arrival), not the last admitted


def test_output_block_caching_next_turn_hits():
    prompt = tokens(1, 40)
    output = tokens(2, 30)
    eng = engine()
    eng.add(
        SimRequest(
            "t1", 40, 30, [h for h in _hashes(prompt)], output_token_ids=lambda n: output[:n], prompt_tail=prompt[32:]
        )
    )
    run(eng)
    follow = prompt + output + tokens(3, 10)
    eng.add(SimRequest("t2", len(follow), 2, _hashes(follow)))
    eng.step(100.0)
    # blocks 0..3 (64 tokens) hit: 2 prompt blocks and 2 blocks that hold the first answer
    assert eng.request("t2").num_cached_tokens == 64

    eng2 = engine()  # without output_token_ids only prompt blocks are cached
    eng2.add(SimRequest("t1", 40, 30, _hashes(prompt)))
    run(eng2)
    eng2.add(SimRequest("t2", len(follow), 2, _hashes(follow)))
    eng2.step(100.0)
    assert eng2.request("t2").num_cached_tokens == 32


def _hashes(toks):
    from steersman.text.tokenizer import block_hashes

    return block_hashes(toks, BS)


def test_add_validation():
    eng = engine(max_model_len=1000)
    with pytest.raises(ValueError, match="max_model_len"):
        eng.add(req("a", 900, out=101))
    eng.add(req("ok", 900, out=100))
    with pytest.raises(ValueError, match="duplicate"):
        eng.add(req("ok", 10))
    with pytest.raises(ValueError):
        eng.add(SimRequest("x", 0, 1))
    with pytest.raises(ValueError, match="prompt_tail"):
        eng.add(SimRequest("y", 20, 2, output_token_ids=lambda n: [0] * n))
    small = engine(kv_blocks=4)
    with pytest.raises(ValueError):
        small.add(req("big", 60, out=10))


def test_kv_smaller_than_max_model_len_is_refused():
    with pytest.raises(ValueError, match="max_model_len"):
        engine(kv_blocks=10, max_model_len=4096)


def test_priority_preempts_an_already_scheduled_request():
    """vLLM gives an already-scheduled victim's tokens back and retries the request that needed blocks."""
    eng = engine(scheduling_policy="priority", kv_blocks=9, max_model_len=144)
    eng.add(req("a", 48, out=5, priority=0, seed=1))
    eng.add(req("b", 40, out=5, priority=9, seed=2, arrival=1.0))
    eng.add(req("c", 32, out=5, priority=1, seed=3, arrival=2.0))
    r = eng.step(0.0)
    assert eng.state().kv_blocks_used == 3 + 3 + 2
    r = eng.step(r.end)  # a takes the last free block, b needs none, c needs one: b goes
    assert r.preempted == ["b"] and [rid for rid, _ in r.outputs] == ["a", "c"]
    assert r.num_decode_tokens == 2 and r.num_seqs == 2
    b = eng.request("b")
    assert b.status == "waiting" and b.num_computed == 0 and b.num_output == 1 and b.blocks == []
    assert eng.state().kv_blocks_used == 4 + 3


def test_waiting_gauge_holds_what_the_running_steps_schedule_left_waiting():
    """vLLM makes its stats once per step: ``num_requests_waiting`` is what that step's schedule could not take.
    A request that arrives while the step runs is not in it (the next step schedules it), nor once the step is over
    while requests run (the next step is due: a server's step loop resumes a little after the step's end); before
    any step, or with nothing running and no step (idle, loading), the gauge is the queue as it is."""
    eng = engine(max_num_batched_tokens=100)
    for rid, n in (("a", 60), ("b", 60), ("c", 10)):
        eng.add(req(rid, n, out=3))
    assert eng.state(0.0).num_waiting == 3  # nothing scheduled yet
    r1 = eng.step(0.0)
    mid = (r1.start + r1.end) / 2
    assert eng.state(mid).num_waiting == 1  # c: the budget was spent on a and b
    eng.add(req("d", 10, out=3))  # arrives while the step runs
    assert eng.state(mid).num_waiting == 1 and eng.state().num_waiting == 2  # as of the schedule; without a time: now
    assert eng.state(r1.end + 1.0).num_waiting == 1  # over, a and b run: the next step is due, the gauge unchanged
    r2 = eng.step(r1.end)
    assert r2 is not None and eng.state(r2.start).num_waiting == 0  # it took c and d


def test_waiting_gauge_is_the_queue_when_nothing_runs():
    eng = engine(max_num_batched_tokens=100)
    eng.add(req("a", 10, out=1))
    r1 = eng.step(0.0)
    assert r1.finished == ["a"] and eng.state(r1.end).num_waiting == 0
    eng.add(req("b", 10, out=1))  # an idle engine: the request waits for the step it wakes
    assert eng.state(r1.end + 1.0).num_waiting == 1
