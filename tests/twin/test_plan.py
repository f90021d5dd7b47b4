"""`steersman plan`: the cheapest fleet meeting the SLO (one GPU type or a mix of two), and replicas per hour.

The search is tested against a capacity model with a known answer (a fleet meets the SLO when its
replicas' capacities add up to the load), the twin-backed planner end to end on a small chatbot load
(its answers re-simulated), and the command a user types.
"""

import itertools
import math
import os
import subprocess
import sys

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.fleet.config import parse_fleet
from steersman.sim import gpu_profile
from steersman.twin.plan import plan_capacity
from steersman.twin.plan_mix import TypeFit, candidates, cover
from steersman.twin.run import Experiment, scale_spec

SPEC = {"model": "llama-3.1-8b", "duration_s": 60.0,
        "sources": [{"kind": "chatbot", "slo": "interactive", "tasks_per_s": 14.0, "system_prompt_tokens": 600}]}
PRICE = {g: gpu_profile(g).price_per_hour for g in ("H100-SXM", "A100-80GB", "L40S")}


def linear(cap: dict[str, float], need: float, plateau: dict[str, float] | None = None):
    """A trial whose fleet meets the target exactly when its replicas' capacities add up to ``need``."""
    def trial(fleet):
        if plateau and len(fleet) == 1 and fleet[0][0] in plateau:
            got = plateau[fleet[0][0]]
        else:
            total = sum(cap[g] * k for g, k in fleet)
            got = 1.0 if total >= need - 1e-9 else min(0.98, total / need)  # short of the load: short of 99%
        return {"slo_attainment": got, "requests": 1000, "refused": 0, "failed": 0, "cost_per_successful_task_usd": 0.01}
    return trial


def oracle(cap: dict[str, float], need: float, limit: int = 64) -> float:
    """The cheapest fleet of one or two types covering ``need``, by brute force."""
    best = math.inf
    for g in cap:
        best = min(best, math.ceil(need / cap[g] - 1e-9) * PRICE[g])
    for a, b in itertools.permutations(cap, 2):
        for x in range(1, limit):
            y = max(1, math.ceil((need - x * cap[a]) / cap[b] - 1e-9))
            best = min(best, x * PRICE[a] + y * PRICE[b])
    return best


@pytest.mark.parametrize("cap,need", [
    ({"A100-80GB": 1.0, "L40S": 0.5}, 7.3),                      # 7 A100 + 1 L40S beats 8 A100 and 15 L40S
    ({"A100-80GB": 1.0, "L40S": 0.55, "H100-SXM": 1.4}, 9.9),
    ({"A100-80GB": 1.0, "L40S": 0.45, "H100-SXM": 1.6}, 3.05),
    ({"A100-80GB": 1.0, "L40S": 0.5}, 8.0),                       # a whole number of A100s: no mix is cheaper
])
def test_the_search_finds_the_cheapest_fleet_of_a_capacity_model(cap, need):
    p = plan_capacity(SPEC, list(cap), trial=linear(cap, need), max_mixed_trials=64)
    singles = {o.gpu: o.replicas for o in p.options if not o.mixed}
    for g, c in cap.items():  # each type: the smallest count that covers the load
        assert singles[g] == math.ceil(need / c - 1e-9)
    assert p.best.cost_per_hour == pytest.approx(oracle(cap, need))
    cheapest_single = min(o.cost_per_hour for o in p.options if not o.mixed)
    tried = [sum(PRICE[g] * k for g, k in f) for f, _ in p.mixed_tried]
    assert tried == sorted(tried) and all(c < cheapest_single for c in tried)  # cheapest first, never dearer
    assert [a >= p.target for _, a in p.mixed_tried].count(True) <= 1  # stops at the first mix that meets


@settings(max_examples=60, deadline=None)
@given(a=st.floats(0.3, 3.0), b=st.floats(0.3, 3.0), need=st.floats(0.5, 20.0))
def test_the_search_matches_brute_force_on_any_linear_capacity(a, b, need):
    cap = {"A100-80GB": a, "L40S": b}
    p = plan_capacity(SPEC, list(cap), trial=linear(cap, need), max_mixed_trials=10_000)
    assert p.best.cost_per_hour == pytest.approx(oracle(cap, need, limit=80))


def test_a_mix_is_kept_only_when_it_meets_and_the_trials_are_bounded():
    cap, need = {"A100-80GB": 1.0, "L40S": 0.5}, 7.3
    p = plan_capacity(SPEC, list(cap), trial=linear(cap, need))
    assert p.best.fleet == (("A100-80GB", 7), ("L40S", 1)) and p.best.mixed
    assert p.best.gpu == "7 x A100-80GB + 1 x L40S" and p.best.replicas == 8
    # the same load with a tighter budget of mixed trials: none tried, the single type stays
    p0 = plan_capacity(SPEC, list(cap), trial=linear(cap, need), max_mixed_trials=0)
    assert p0.best.fleet == (("A100-80GB", 8),) and not p0.mixed_tried
    # mixes that fall short are reported and not kept
    short = plan_capacity(SPEC, list(cap), trial=linear({"A100-80GB": 1.0, "L40S": 0.2}, 7.9))
    assert short.best.fleet == (("A100-80GB", 8),)
    assert all(a < short.target for _, a in short.mixed_tried) and len(short.mixed_tried) <= 6


def test_types_that_cannot_meet_the_slo_are_reported_not_planned():
    cap = {"A100-80GB": 1.0, "L40S": 0.5, "H100-SXM": 1.5}

    def trial(fleet):
        if fleet == (("H100-SXM", 1),):
            raise ValueError("llama-3.1-8b does not fit H100-SXM here")
        return linear(cap, 3.5, plateau={"L40S": 0.93})(fleet)

    p = plan_capacity(SPEC, list(cap), trial=trial)
    assert [o.gpu for o in p.options] == ["A100-80GB"]
    assert "plateaus at 93.0%" in p.infeasible["L40S"] and "does not fit" in p.infeasible["H100-SXM"]
    assert not p.mixed_tried  # one type left: nothing to mix


def test_hourly_fleets_follow_the_curve_and_never_cost_more_than_the_peak():
    cap, need = {"A100-80GB": 1.0, "L40S": 0.5}, 7.3
    p = plan_capacity(SPEC, list(cap), trial=linear(cap, need))
    costs = [c for *_, c in p.hourly]
    assert len(p.hourly) == 24 and max(costs) == pytest.approx(p.best.cost_per_hour)
    by_load = sorted(zip((rps for _, rps, _, _ in p.hourly), costs))
    assert all(c1 <= c2 + 1e-9 for (_, c1), (_, c2) in zip(by_load, by_load[1:]))  # more load never costs less
    peak = max(rps for _, rps, _, _ in p.hourly)
    assert all(f == p.best.fleet for _, rps, f, _ in p.hourly if rps == peak)
    for _, rps, fleet, c in p.hourly:  # each hour's fleet covers its share with the peak's per-replica capacity
        share = rps / peak
        assert sum(k / {"A100-80GB": 8, "L40S": 15}[g] for g, k in fleet) >= share - 1e-9 or fleet == p.best.fleet


def test_cover_and_candidates_arithmetic():
    fits = [TypeFit("A100-80GB", 8, 1.39), TypeFit("L40S", 16, 0.79)]
    first = candidates(fits, 8 * 1.39)
    assert first[0] == (("A100-80GB", 7), ("L40S", 1))
    for fl in first:  # optimistic capacity covers the load; never a count a single type already meets with
        d = dict(fl)
        assert d["A100-80GB"] / 7 + d["L40S"] / 15 > 1 and d["A100-80GB"] < 8 and d["L40S"] < 16
    assert cover(fits, 1.0) == ((("A100-80GB", 8),), pytest.approx(8 * 1.39))
    fleet, cost = cover(fits, 0.677)  # 5/8 + 1/16 = 0.6875 covers it for less than 6 A100s
    assert fleet == (("A100-80GB", 5), ("L40S", 1)) and cost == pytest.approx(5 * 1.39 + 0.79)
    assert candidates([TypeFit("A100-80GB", 1, 1.39), TypeFit("L40S", 1, 0.79)], 10.0) == []


def _twin_attainment(fleet, target: float) -> tuple[float, bool]:
    doc = {"simulated": {"replicas": [{"gpu": g, "model": SPEC["model"], "count": k} for g, k in fleet]}}
    s = Experiment(parse_fleet(doc, "test"), scale_spec(SPEC, 1.2), None, 0, None).run("steersman")
    got = s["slo_attainment"] or 0.0
    return got, got >= target and s["refused"] + s["failed"] <= (1 - target) * s["requests"]


@pytest.fixture(scope="module")
def twin_plan():
    """The twin-backed plan of SPEC over A100 and L40S, searched in this process (~5-8 s: made once)."""
    return plan_capacity(SPEC, ["A100", "L40S"], target=0.99, headroom=0.2)


def test_the_twin_backed_plan_holds_when_its_fleets_are_simulated_again(twin_plan):
    p = twin_plan
    best = p.best
    assert best.cost_per_hour <= min(o.cost_per_hour for o in p.options)
    assert _twin_attainment(best.fleet, 0.99)[1]  # the plan's fleet meets the SLO
    for o in p.options:
        if not o.mixed and o.replicas > 1:  # one replica fewer of a single type does not
            (g, n), = o.fleet
            assert not _twin_attainment(((g, n - 1),), 0.99)[1], o
    cheapest_single = min(o.cost_per_hour for o in p.options if not o.mixed)
    for fleet, got in p.mixed_tried:  # every mix tried was cheaper than the cheapest single type
        assert sum(PRICE[g] * k for g, k in fleet) < cheapest_single
        assert (got >= 0.99) == any(o.fleet == fleet for o in p.options)


def test_plan_command(tmp_path):
    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump({**SPEC, "duration_s": 30.0}))
    cmd = [sys.executable, "-m", "steersman", "plan", "--workload", str(w), "--gpus", "A100,L40S"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "cheapest:" in r.stdout and "elasticity over a day" in r.stdout and "a day elastic" in r.stdout
    bad = subprocess.run(cmd + ["--slo", "1.5"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--slo must be in (0, 1]" in bad.stdout + bad.stderr
    gpu = subprocess.run(cmd[:-1] + ["TPU9"], capture_output=True, text=True, timeout=120)
    assert gpu.returncode != 0 and "TPU9" in gpu.stdout + gpu.stderr and "Traceback" not in gpu.stdout + gpu.stderr


def test_plan_command_takes_a_trace_scaled_up(shared_dir):
    trace = shared_dir / "traces" / "azure-llm-2023-code.csv"
    cmd = [sys.executable, "-m", "steersman", "plan", "--trace", str(trace), "--limit", "200", "--speed", "8",
           "--gpus", "L40S,A100"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "cheapest:" in r.stdout and "L40S" in r.stdout
    both = subprocess.run(cmd + ["--workload", str(trace)], capture_output=True, text=True, timeout=120)
    assert both.returncode == 2 and "exactly one of --workload or --trace" in both.stdout + both.stderr


def test_a_gpu_named_twice_is_planned_once_and_none_is_an_error():
    cap = {"A100-80GB": 1.0}
    p = plan_capacity(SPEC, ["A100", "a100-80gb"], trial=linear(cap, 2.5))
    assert [o.fleet for o in p.options] == [(("A100-80GB", 3),)] and not p.mixed_tried
    with pytest.raises(ValueError, match="no GPU type"):
        plan_capacity(SPEC, [], trial=linear(cap, 2.5))
    with pytest.raises(KeyError, match="TPU9"):
        plan_capacity(SPEC, ["TPU9"], trial=linear(cap, 2.5))


def test_types_searched_in_parallel_give_the_same_plan_and_spawn_beside_other_threads(twin_plan):
    # forking a process that runs other threads can copy a lock one of them holds: the planner spawns then
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        two = plan_capacity(SPEC, ["A100", "L40S"], target=0.99, headroom=0.2, workers=2)
    finally:
        stop.set()
        t.join()
    one = twin_plan
    assert [(o.fleet, o.cost_per_hour, o.slo_attainment) for o in two.options] == \
        [(o.fleet, o.cost_per_hour, o.slo_attainment) for o in one.options]
    assert two.hourly == one.hourly and two.mixed_tried == one.mixed_tried and two.trials == one.trials
    assert two.best is not None and [o.gpu for o in two.options][:2] == ["A100-80GB", "L40S"]
