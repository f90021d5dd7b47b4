"""A workflow one of whose calls missed its SLO has failed as a task: the gateway marks it, and with
``admission.workflow_missed_demotion`` (opt-in) its later calls are scheduled that many bands lower."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from tests.control.test_retry_accounting import _advance, _go, _setup

from steersman.config.admission import AdmissionSettings
from steersman.control.workflow import WorkflowHeaders, WorkflowTracker, effective_priority
from steersman.policy.request import LatencyBudget, PriorityClass as P


def test_a_missed_call_marks_its_workflow_and_the_band_drops_when_asked():
    flows = WorkflowTracker()
    wf = flows.track("t", WorkflowHeaders("w", 1, 3), 0.0)
    assert not wf.missed
    flows.record("t", "w", tokens=10, cost_usd=0.01, now=1.0)  # met
    assert not flows.track("t", WorkflowHeaders("w", 2, 3), 1.0).missed
    flows.record("t", "w", tokens=10, cost_usd=0.01, now=2.0, met=False)
    flows.record("t", "w", tokens=10, cost_usd=0.01, now=3.0, met=True)  # a later call in time does not undo it
    wf = flows.track("t", WorkflowHeaders("w", 3, 3), 3.0)
    assert wf.missed and not flows.track("u", WorkflowHeaders("w", 1, 3), 3.0).missed  # per tenant
    assert effective_priority(P.CRITICAL, wf, 0) == P.CRITICAL  # off by default
    assert [effective_priority(p, wf, 1) for p in P] == [P.STANDARD, P.SHEDDABLE, P.BATCH, P.BATCH]
    assert effective_priority(P.CRITICAL, wf, 3) == P.BATCH
    assert effective_priority(P.CRITICAL, replace(wf, missed=False), 3) == P.CRITICAL
    assert effective_priority(P.CRITICAL, None, 3) == P.CRITICAL
    assert AdmissionSettings().workflow_missed_demotion == 0
    with pytest.raises(ValueError):
        AdmissionSettings(workflow_missed_demotion=4)


@pytest.mark.parametrize("ttft,tpot,deadline,ok,missed", [
    (0.5, 0.2, None, True, False),  # first token after 0.1 s, 9 more tokens in 0.9 s: 0.1 s apart
    (0.05, None, None, True, True),  # TTFT over
    (None, 0.05, None, True, True),  # TPOT over
    (None, None, 100.5, True, True),  # ended after its deadline
    (None, None, None, False, True),  # failed
])
def test_the_accounting_judges_each_call_as_its_client_saw_it(ttft, tpot, deadline, ok, missed):
    clock, fleet, acc, plane, flows, req, admit = _setup()
    req = replace(req, budget=LatencyBudget(ttft, tpot, deadline))
    started = _go(acc, req, admit, 0)
    _advance(clock, 0.1)
    fleet.first_token(started.ticket)
    _advance(clock, 0.9)
    acc.ended(started, 10, ok)
    assert flows.track("t", WorkflowHeaders("job", 3, 5), clock.now()).missed is missed


def test_in_the_twin_demotion_moves_capacity_to_tasks_that_can_still_succeed():
    """bench/policies' agentic mix well past the fleet's capacity: with the copilots' failed tasks demoted, more
    tasks succeed at the same fleet cost (the numbers are deterministic: a seeded workload on a virtual clock)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "policies"))
    try:
        from workloads import bench_fleet, workloads
    finally:
        sys.path.pop(0)
    import msgspec

    from steersman.twin.run import Experiment

    wl = next(w for w in workloads(600, 180.0) if w.name == "agentic")
    fleet = bench_fleet()
    on = msgspec.structs.replace(fleet, admission=replace(fleet.admission, workflow_missed_demotion=3))
    off_run = Experiment(fleet, wl.spec, wl.base_dir, 0).run("steersman", 8.0)
    on_run = Experiment(on, wl.spec, wl.base_dir, 0).run("steersman", 8.0)
    assert on_run["tasks"] == off_run["tasks"]
    # measured: 1,650 -> 1,734 of 3,719 tasks, 1,597 -> 1,660 successful tasks per $ (thirty-fifth session, once the
    # twin read an engine that went idle just after a scrape at the interval's end: the run without demotion gained
    # most, from 1,542 tasks and 1,556 per $; with demotion it read 1,691 and 1,722); ~1,850 tasks are still under
    # way at 180 s (unfinished, never successful: before the twenty-seventh session they counted as successes when
    # their calls so far met their SLO, and the gain read 2,325 -> 2,761)
    assert on_run["tasks_succeeded"] > 1.03 * off_run["tasks_succeeded"], (on_run["tasks_succeeded"],
                                                                            off_run["tasks_succeeded"])
    assert on_run["successful_tasks_per_usd"] > 1.02 * off_run["successful_tasks_per_usd"]


def test_live_a_slow_call_fails_its_task_and_the_next_call_goes_a_band_lower():
    import httpx
    from openai import OpenAI

    from steersman.enginesim.app import SimServerConfig
    from steersman.testing import LiveFleet

    with LiveFleet(sims=[SimServerConfig(gpu="H100", model="llama-3.1-8b", speedup=50.0, port=0)],
                   extra={"admission": {"workflow_missed_demotion": 1}}) as lf:
        seen = []
        plane = lf.gateway.plane
        arrive = plane.arrive

        def spy(item, req, *a, **k):
            seen.append(req.priority)
            return arrive(item, req, *a, **k)
        plane.arrive = spy
        wf = {"x-steersman-workflow-id": "task-1", "x-steersman-slo": "interactive"}
        with OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
            def call(step: int) -> None:
                for _ in client.chat.completions.create(model="llama-3.1-8b", max_tokens=4, stream=True,
                                                        messages=[{"role": "user", "content": f"step {step}"}],
                                                        extra_headers={**wf, "x-steersman-workflow-step": str(step)}):
                    pass
            call(1)  # within its SLO
            r = httpx.post(lf.sims[0].url + "/admin/faults", json={"slowdown": 2000})
            assert r.status_code == 200, r.text
            call(2)  # ~0.35 s a token against the interactive class's 40 ms TPOT: the task has failed
            httpx.delete(lf.sims[0].url + "/admin/faults")
            call(3)
        assert seen == [P.STANDARD, P.STANDARD, P.SHEDDABLE]


def _missed(flows, clock):
    return flows.track("t", WorkflowHeaders("job", 3, 5), clock.now()).missed


@pytest.mark.parametrize("ttft,tpot,missed", [
    (2.0, 0.2, False),  # was missed: a "TTFT" of 10.4 s
    (None, 0.04, True),  # was met: 5 s over all 300 gaps, 17 ms
])
def test_a_stream_continued_on_another_replica_is_judged_on_its_clients_first_token(ttft, tpot, missed):
    """Its client got its first token after 0.1 s, then 200 tokens 50 ms apart; its engine died and the stream went
    on from another replica (0.2 s to its first token there, 100 more 50 ms apart).  It was judged on the last leg:
    a "TTFT" of 10.4 s (missed), and a TPOT over that leg's tokens only."""
    clock, fleet, acc, plane, flows, req, admit = _setup()
    req = replace(req, max_tokens=400, budget=LatencyBudget(ttft, tpot, None, "standard"))
    first = _go(acc, req, admit, 0)
    _advance(clock, 0.1)
    acc.first_token(first)
    _advance(clock, 10.0)
    gone = acc.left(first)
    assert gone.client_first_at == pytest.approx(100.1)
    second = _go(acc, req, admit, 1, earlier=gone)
    assert second.client_first_at == pytest.approx(100.1)
    _advance(clock, 0.2)
    acc.first_token(second)
    _advance(clock, 5.0)
    acc.ended(second, 301, True, leg_tokens=101)
    # the client's mean TPOT: 15.2 s over 300 gaps, ~51 ms (the failover gap included)
    assert _missed(flows, clock) is missed


def test_a_stream_whose_first_leg_failed_before_its_first_token_is_judged_on_the_next_legs():
    clock, fleet, acc, plane, flows, req, admit = _setup()
    req = replace(req, budget=LatencyBudget(0.5, None, None, "standard"))
    gone = acc.left(_go(acc, req, admit, 0))
    assert gone.client_first_at is None
    second = _go(acc, req, admit, 1, earlier=gone)
    _advance(clock, 0.6)
    acc.first_token(second)
    acc.ended(second, 1, True)
    assert _missed(flows, clock)  # its client waited 0.6 s for a first token


@pytest.mark.parametrize("ttft,tpot,deadline,e2e,missed", [
    (2.0, 0.2, None, 3.1, False),  # 100 tokens after the first, 30 ms apart: within 2 s + 100 x 0.2 s (was missed)
    (2.0, 0.01, None, 3.1, True),  # over 2 s + 100 x 10 ms
    (0.5, 0.01, 200.0, 3.1, False),  # a deadline: judged against it alone
    (0.5, 0.01, 102.0, 3.1, True),
    (2.0, None, None, 30.0, False),  # no TPOT target: the decode time is unbounded, the TTFT not seen
])
def test_a_whole_response_is_judged_end_to_end(ttft, tpot, deadline, e2e, missed):
    """A non-streamed call shows its client only its end (the gateway marks its "first token" when the whole body
    arrived): it was judged on the TTFT target alone, so one meeting its engine timing was marked missed."""
    clock, fleet, acc, plane, flows, req, admit = _setup()
    req = replace(req, stream=False, max_tokens=101, budget=LatencyBudget(ttft, tpot, deadline, "standard"))
    started = _go(acc, req, admit, 0)
    _advance(clock, e2e)
    fleet.first_token(started.ticket)  # forward._whole: the whole body arrived
    acc.ended(started, 101, True)
    assert _missed(flows, clock) is missed


def test_a_whole_one_token_response_is_judged_on_its_ttft():
    for e2e, missed in ((0.4, False), (0.6, True)):
        clock, fleet, acc, plane, flows, req, admit = _setup()
        req = replace(req, stream=False, budget=LatencyBudget(0.5, 0.01, None, "standard"))
        started = _go(acc, req, admit, 0)
        _advance(clock, e2e)
        fleet.first_token(started.ticket)
        acc.ended(started, 1, True)
        assert _missed(flows, clock) is missed
