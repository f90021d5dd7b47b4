"""Agentic generators: determinism, prefix sharing, closed loop, retries, rates and offered load."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from steersman.twin.workload import AgentSource, Arrival, DailyCurve, Mix, Workload, preset
from steersman.twin.workload.dists import Const, as_ints, parse_dist
from wl_helpers import common_prefix, content, drive

BS = 16


def _src(kind="copilot", **kw):
    kw.setdefault("tasks_per_s", 1.0)
    kw.setdefault("seed", 7)
    app = kw.pop("app", None) or preset(kind, **kw.pop("app_kw", {}))
    return AgentSource(app, **kw)


def test_protocol_and_fields():
    w = _src(max_tasks=2, tenant="acme", model="m1", slo="interactive", deadline_s=30.0)
    assert isinstance(w, Workload)
    assert w.start() == []
    seen, _ = drive(w, start=False)
    assert [a.seq for a in seen] == list(range(len(seen)))
    for a in seen:
        assert type(a) is Arrival
        assert (a.tenant, a.model, a.slo_class, a.deadline_s) == ("acme", "m1", "interactive", 30.0)
        assert a.workflow in ("copilot-0", "copilot-1") and 1 <= a.step <= a.steps and 10 <= a.steps <= 20
        assert a.max_tokens == 2048 and 1 <= a.output_tokens <= a.max_tokens
        assert len(a.block_hashes) == a.prompt_tokens // BS
        assert all(isinstance(h, int) and -(1 << 63) <= h < (1 << 63) for h in a.block_hashes)
    with pytest.raises(AttributeError):
        seen[0].time = 1.0  # frozen
    assert w.done and w.next_time == math.inf
    st = w.stats
    assert st.tasks_started == st.tasks_completed == 2 and st.emitted == st.completed == len(seen)


def test_same_seed_same_arrivals_other_seed_differs():
    runs = []
    for seed in (3, 3, 4):
        seen, _ = drive(_src("chatbot", tasks_per_s=5.0, seed=seed, end_s=60.0))
        runs.append([(a.time, a.seq, *content(a)) for a in seen])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_task_content_does_not_depend_on_completion_timing():
    """Two fleets that finish calls at different times see the same tasks, steps and tokens."""
    def by_step(latency):
        seen, _ = drive(_src("copilot", tasks_per_s=0.5, end_s=120.0), latency=latency)
        return {(a.workflow, a.step): content(a) for a in seen}

    fast = by_step(0.05)
    slow = by_step(lambda a: 0.5 + (a.seq * 7919 % 13) * 0.7)
    assert fast.keys() == slow.keys() and fast == slow


def test_context_grows_and_each_prompt_extends_the_previous_one():
    w = _src("copilot", max_tasks=5, app_kw={"max_context_tokens": None})
    _, done = drive(w)
    steps = 0
    for a, t, ok, fu in done:
        if a.step == a.steps:
            assert fu == []
            continue
        (b,) = fu
        steps += 1
        assert (b.workflow, b.step, b.steps, b.attempt) == (a.workflow, a.step + 1, a.steps, 0)
        assert b.prompt_tokens >= a.prompt_tokens + a.output_tokens  # + the tool result
        assert b.block_hashes[: len(a.block_hashes)] == a.block_hashes  # step k's blocks start step k+1
        assert len(b.block_hashes) == b.prompt_tokens // BS
        # the block that was partial at step k gets its hash when full, and it is new
        assert len(b.block_hashes) > len(a.block_hashes)
        assert b.block_hashes[len(a.block_hashes)] not in a.block_hashes
    assert steps > 40


def test_tasks_of_one_app_share_exactly_the_system_prompt_blocks():
    S = 1500  # 93 full blocks + 12 tokens: the straddling block belongs to the task
    w = _src("copilot", max_tasks=20, app_kw={"system_prompt_tokens": S})
    w.start()
    firsts = w.next_batch(math.inf)
    assert len(firsts) == 20
    nS = S // BS
    sys_blocks = firsts[0].block_hashes[:nS]
    for i, a in enumerate(firsts):
        for b in firsts[i + 1:]:
            assert common_prefix(a.block_hashes, b.block_hashes) == nS
            assert set(a.block_hashes[nS:]).isdisjoint(b.block_hashes)
        assert a.block_hashes[:nS] == sys_blocks


def test_prompt_sharing_across_sources():
    def first(name, S, pid=None, kind="copilot"):
        return _src(kind, name=name, max_tasks=1, app_kw={"system_prompt_tokens": S, "system_prompt_id": pid})

    mix = Mix([first("a", 1600, "shared"), first("b", 1000, "shared"), first("c", 1600), first("d", 1600, kind="research")])
    mix.start()
    a, b, c, d = sorted(mix.next_batch(math.inf), key=lambda x: x.source)
    assert common_prefix(a.block_hashes, b.block_hashes) == 1000 // BS  # the shorter prompt is a prefix of the longer
    assert common_prefix(a.block_hashes, c.block_hashes) == 0  # same size, no shared id: different apps
    assert common_prefix(c.block_hashes, d.block_hashes) == 0
    assert set(a.block_hashes).isdisjoint(c.block_hashes) and set(c.block_hashes).isdisjoint(d.block_hashes)


def test_compaction_restarts_the_context_after_the_system_prompt():
    app = preset("copilot", system_prompt_tokens=160, task_tokens=40, output_tokens=100, tool_tokens=100,
                 calls=12, gap_s=1.0, max_tokens=None, max_context_tokens=1000, compact_to_tokens=64)
    _, done = drive(AgentSource(app, tasks_per_s=1.0, max_tasks=1))
    prompts = [a.prompt_tokens for a, *_ in done]
    assert prompts == [200, 400, 600, 800, 1000, 224, 424, 624, 824, 224, 424, 624]
    for (a, _, _, _), (b, _, _, _) in zip(done, done[1:]):
        shared = common_prefix(a.block_hashes, b.block_hashes)
        assert shared == (160 // BS if b.prompt_tokens < a.prompt_tokens else len(a.block_hashes))
    segs = [set(a.block_hashes[10:]) for a, *_ in done if a.prompt_tokens == 224]
    assert segs[0].isdisjoint(segs[1])  # each compaction writes a new summary


def test_follow_ups_come_only_after_completion_plus_gap():
    app = preset("research", gap_s=2.5, calls=[3, 5])
    _, done = drive(AgentSource(app, tasks_per_s=0.5, max_tasks=10), latency=lambda a: 0.3 + 0.01 * a.seq)
    n = 0
    for a, t, ok, fu in done:
        for b in fu:
            assert b.time == pytest.approx(t + 2.5) and b.time > a.time
            n += 1
    assert n > 10
    _, done = drive(_src("copilot", max_tasks=10))  # lognormal gaps
    assert all(b.time >= t for a, t, ok, fu in done for b in fu)


def test_retry_then_abandon():
    app = preset("copilot", calls=5, gap_s=1.0, retries=2, retry_backoff_s=0.5)
    w = AgentSource(app, tasks_per_s=1.0, max_tasks=1)
    w.start()
    (a,) = w.next_batch(math.inf)
    (b,) = w.on_complete(a, 10.0, True)
    (r1,) = w.on_complete(b, 20.0, False)
    assert (r1.step, r1.attempt, r1.time) == (2, 1, 20.5)
    assert content(r1)[:-2] == content(b)[:-2]  # same prompt and output, a new attempt
    (r2,) = w.on_complete(r1, 21.0, False)
    assert (r2.step, r2.attempt, r2.time) == (2, 2, 22.0)  # backoff doubles
    (c,) = w.on_complete(r2, 23.0, True)  # the retry worked: the task goes on
    assert (c.step, c.attempt, c.time) == (3, 0, 24.0)
    assert c.block_hashes[: len(b.block_hashes)] == b.block_hashes
    assert w.on_complete(c, 25.0, False)[0].attempt == 1
    st = w.stats
    assert (st.emitted, st.completed, st.failed, st.retries) == (6, 2, 3, 3)


def test_abandon_after_retries():
    app = preset("copilot", calls=5, gap_s=1.0, retries=2)
    w = AgentSource(app, tasks_per_s=1.0, max_tasks=1)
    w.start()
    (a,) = w.next_batch(math.inf)
    cur, attempts = a, []
    while True:
        attempts.append(cur.attempt)
        fu = w.on_complete(cur, cur.time + 1.0, False)
        if not fu:
            break
        (cur,) = fu
    assert attempts == [0, 1, 2]
    assert w.done
    st = w.stats
    assert (st.emitted, st.failed, st.retries, st.tasks_started, st.tasks_abandoned, st.tasks_completed) == (3, 3, 2, 1, 1, 0)


def test_completing_twice_or_unknown_is_an_error():
    w = _src(max_tasks=1)
    with pytest.raises(RuntimeError):
        w.next_batch(1.0)
    w.start()
    with pytest.raises(RuntimeError):
        w.start()
    (a,) = w.next_batch(math.inf)
    w.on_complete(a, a.time + 1, True)
    with pytest.raises(ValueError):
        w.on_complete(a, a.time + 2, True)


def test_task_arrival_rate_and_means_match_the_spec():
    rate, T = 5.0, 2000.0
    app = preset("copilot", calls=[10, 20], output_tokens={"dist": "lognormal", "mean": 300, "cv": 1.0},
                 max_tokens=1000)
    w = AgentSource(app, tasks_per_s=rate, end_s=T, seed=11)
    w.start()
    firsts = w.next_batch(T + 1)
    times = np.array([a.time for a in firsts])
    assert abs(len(firsts) / (rate * T) - 1) < 0.04
    gaps = np.diff(times)
    assert abs(gaps.std() / gaps.mean() - 1) < 0.05  # Poisson: exponential gaps
    steps = np.array([a.steps for a in firsts])
    assert abs(steps.mean() - 15) < 0.15 and steps.min() == 10 and steps.max() == 20
    outs = np.array([a.output_tokens for a in firsts])
    ref = as_ints(parse_dist({"dist": "lognormal", "mean": 300, "cv": 1.0}).sample(np.random.default_rng(0), 400_000), 1, 1000)
    assert abs(outs.mean() / ref.mean() - 1) < 0.03
    assert outs.max() == 1000  # capped by max_tokens


@pytest.mark.parametrize("kind", ["chatbot", "copilot", "research"])
def test_offered_load_matches_what_is_generated(kind):
    rate, T = {"chatbot": 4.0, "copilot": 0.5, "research": 0.1}[kind], 1500.0
    w = AgentSource(kind, tasks_per_s=rate, end_s=T, seed=5)
    load = w.offered_load()
    seen, done = drive(w, latency=0.0)
    assert w.done
    n_tasks = len({a.workflow for a in seen})
    assert load.tasks_per_s == pytest.approx(rate)
    # scale by the tasks actually started, so the check is on the per-task model, not on Poisson noise
    k = rate * T / n_tasks
    assert len(seen) * k / T == pytest.approx(load.requests_per_s, rel=0.05)
    assert sum(a.prompt_tokens for a in seen) * k / T == pytest.approx(load.prompt_tokens_per_s, rel=0.06)
    assert sum(a.output_tokens for a in seen) * k / T == pytest.approx(load.output_tokens_per_s, rel=0.06)
    nS = w.app.system_prompt_tokens // BS
    prev: dict[str, tuple] = {}
    new = 0
    for a in seen:
        p = prev.get(a.workflow)
        matched = nS if p is None else common_prefix(p, a.block_hashes)
        new += a.prompt_tokens - BS * matched
        prev[a.workflow] = a.block_hashes
    assert new * k / T == pytest.approx(load.new_prompt_tokens_per_s, rel=0.06)
    assert load.new_prompt_tokens_per_s < load.prompt_tokens_per_s


def test_user_population_closed_loop():
    app = preset("copilot", calls=2, gap_s=1.0)
    w = AgentSource(app, users=5, think_s=10.0, tasks_per_user=3, seed=2)
    seen, done = drive(w, latency=0.5)
    first = seen[:5]
    assert all(a.time == 0.0 and a.step == 1 for a in first) and seen[5].time > 0
    assert w.next_time == math.inf
    assert w.done and len(seen) == 5 * 3 * 2
    assert len({a.workflow for a in seen}) == 15
    for a, t, ok, fu in done:
        if a.step == 2 and fu:
            (b,) = fu
            assert b.step == 1 and b.time == pytest.approx(t + 10.0)
    load = w.offered_load(latency_s=0.5)  # a user cycle: 1 gap + 2 calls x 0.5 s + 10 s think
    assert load.tasks_per_s == pytest.approx(5 / 12.0) and load.requests_per_s == pytest.approx(10 / 12.0)


def test_user_population_tasks_do_not_depend_on_completion_order():
    def run(latency):
        w = AgentSource("chatbot", users=4, think_s=5.0, ramp_s=10.0, tasks_per_user=3, seed=9)
        seen, _ = drive(w, latency=latency)
        return {(a.workflow, a.step): content(a) for a in seen}

    assert run(0.2) == run(lambda a: 0.1 + (a.seq % 5))


def test_presets_have_the_talks_shapes():
    calls = {k: preset(k).calls for k in ("chatbot", "copilot", "research", "autonomous")}
    assert 1 <= calls["chatbot"].mean <= 6
    assert 10 <= calls["copilot"].mean <= 20
    assert 40 <= calls["research"].mean <= 60
    assert calls["autonomous"].mean >= 300 and calls["autonomous"].quantile_hi() >= 1000
    w = AgentSource("autonomous", tasks_per_s=0.01, max_tasks=1, seed=1)
    seen, _ = drive(w, latency=0.1, max_requests=400)
    assert max(a.prompt_tokens for a in seen) <= preset("autonomous").max_context_tokens
    assert all(len(a.block_hashes) == a.prompt_tokens // BS for a in seen)


def test_bad_arguments():
    with pytest.raises(ValueError, match="exactly one"):
        AgentSource("copilot")
    with pytest.raises(ValueError, match="exactly one"):
        AgentSource("copilot", tasks_per_s=1, users=3)
    with pytest.raises(ValueError, match="unknown application"):
        AgentSource("nope", tasks_per_s=1)
    with pytest.raises(ValueError, match="max_context_tokens"):
        preset("copilot", max_context_tokens=1000)
    assert isinstance(preset("copilot", calls=3).calls, Const)


def test_steps_can_be_unannounced():
    seen, _ = drive(_src(max_tasks=1, app_kw={"announce_steps": False}))
    assert all(a.steps is None for a in seen) and [a.step for a in seen] == list(range(1, len(seen) + 1))


def test_per_workflow_calls_are_sequential():
    seen, done = drive(_src("research", tasks_per_s=0.2, end_s=100.0), latency=1.0)
    by_wf = defaultdict(list)
    for a in seen:
        by_wf[a.workflow].append(a)
    for calls in by_wf.values():
        assert [a.step for a in calls] == list(range(1, len(calls) + 1))
        assert all(b.time >= a.time + 1.0 for a, b in zip(calls, calls[1:]))


def test_continuation_hashes_are_the_next_prompts_blocks():
    """The blocks an answer completes carry the hashes the next call's prompt gives them (output-block caching)."""
    w = Mix([_src("research", name="r", max_tasks=3, app_kw={"max_context_tokens": 20000, "compact_to_tokens": 4000})])
    w.start()
    pending = w.next_batch(math.inf)
    checked = compacted = 0
    while pending:
        a = pending.pop()
        cont = w.continuation_hashes(a)
        assert len(a.block_hashes) + len(cont) == (a.prompt_tokens + a.output_tokens) // BS
        fu = w.on_complete(a, a.time + 1.0, True)
        assert w.continuation_hashes(a) == ()  # no longer in flight
        for b in fu:
            if b.prompt_tokens > a.prompt_tokens:
                assert b.block_hashes[: len(a.block_hashes) + len(cont)] == a.block_hashes + cont
                checked += 1
            else:
                assert set(cont).isdisjoint(b.block_hashes)  # compacted: the old output is gone
                compacted += 1
        pending += fu
    assert checked > 100 and compacted > 0


def test_offered_load_is_capped_by_max_tasks_and_tasks_per_user():
    w = AgentSource("chatbot", tasks_per_s=1.0, max_tasks=10, end_s=600.0, seed=3)
    assert w.offered_load().tasks_per_s * 600 == pytest.approx(10)  # 10 tasks over the run, not 600
    assert w.offered_load(0.0, 10.0).tasks_per_s == pytest.approx(1.0)  # ... all of them early on
    assert w.offered_load(100.0, 200.0).tasks_per_s == 0.0
    seen, _ = drive(w, latency=0.5)
    assert len({a.workflow for a in seen}) == 10
    # no end: the rate while it runs, and all of its tasks over any window that covers them
    assert AgentSource("chatbot", tasks_per_s=1.0, max_tasks=10).offered_load().tasks_per_s == pytest.approx(1.0)
    curved = AgentSource("chatbot", tasks_per_s=1.0, max_tasks=100, curve=DailyCurve.sinusoid(0.25, 1.0, 14.0))
    assert curved.offered_load(0.0, 86400.0).tasks_per_s * 86400 == pytest.approx(100)
    # a population of 10 users with one task each
    u = AgentSource(preset("chatbot", calls=1), users=10, think_s=5.0, tasks_per_user=1, end_s=600.0, seed=3)
    assert u.offered_load(latency_s=0.5).tasks_per_s * 600 == pytest.approx(10)
    assert u.offered_load(0.0, 1200.0, latency_s=0.5).tasks_per_s * 1200 == pytest.approx(10)
    seen, _ = drive(u, latency=0.5)
    assert len({a.workflow for a in seen}) == 10
