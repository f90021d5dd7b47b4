"""The decode side of a disaggregated request: KV arrives ready, admission allocates blocks and skips prefill."""

import pytest
from simhelpers import BS, engine, req, run


def test_kv_ready_request_skips_prefill_and_decodes_from_its_second_token():
    eng = engine()
    r = req("d", 1000, out=50, kv_ready=True)
    eng.add(r)
    assert r.num_output == 1  # the prefill replica produced the first token
    first = eng.step(0.0)
    assert first.num_prefill_tokens == 0 and first.num_decode_tokens == 1
    assert first.first_tokens == []  # not its first token: that one came from the prefill replica
    assert r.num_computed == 1001 and r.num_output == 2
    assert r.num_blocks == -(-1001 // BS)
    assert eng.kv.num_used == r.num_blocks
    rest = run(eng, first.end)
    assert r.finished_at == rest[-1].end and r.num_output == 50
    assert all(s.num_prefill_tokens == 0 for s in rest)
    assert len(rest) + 1 == 49  # one decode step per token after the first
    assert eng.state().generation_tokens_total == 49
    assert eng.state().prompt_tokens_total == 0


def test_kv_ready_step_costs_a_decode_not_a_prefill():
    a, b = engine(), engine()
    a.add(req("p", 2000, out=5))
    b.add(req("d", 2000, out=5, kv_ready=True))
    colocated_first = a.step(0.0)
    kv_first = b.step(0.0)
    assert kv_first.duration < colocated_first.duration / 3  # a 2,000-token prefill vs one decode token


def test_kv_ready_admission_waits_for_blocks_and_counts_no_prefix_lookup():
    eng = engine(kv_blocks=100, max_model_len=1600)
    eng.add(req("big", 1400, out=60))
    eng.step(0.0)
    d = req("d", 1000, out=10, kv_ready=True)
    eng.add(d)
    run(eng, 0.0)
    big = eng.request("big")
    assert d.first_scheduled_at >= big.finished_at  # its 63 blocks fit only once the big one left
    assert d.num_output == 10 and d.status == "finished"
    assert eng.state().num_preemptions == 0
    assert eng.state().prefix_queries == 1400  # only the ordinary request looked its prompt up


def test_kv_ready_needs_two_output_tokens():
    with pytest.raises(ValueError, match="max_output must be >= 2"):
        engine().add(req("d", 100, out=1, kv_ready=True))


def test_decode_runs_jump_over_kv_ready_requests_like_single_steps():
    def go(macro: bool):
        eng = engine()
        for i in range(6):
            eng.add(req(f"d{i}", 300 + 100 * i, out=20 + 7 * i, kv_ready=True))
        t = 0.0
        while eng.has_work():
            plan = eng.decode_plan(t) if macro else None
            if plan is not None:
                t = eng.commit(plan, plan.max_steps).end
            else:
                t = eng.step(t).end
        return [eng.request(f"d{i}").finished_at for i in range(6)], eng.num_steps

    (fin1, n1), (fin2, n2) = go(False), go(True)
    assert n1 == n2
    assert fin2 == pytest.approx(fin1, abs=1e-9)
