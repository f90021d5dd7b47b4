"""Failure drills from the workload spec's ``drills:`` list: kill, slow, errors, restore (and their validation)."""

from pathlib import Path

import numpy as np
import pytest

from steersman.fleet.config import parse_fleet
from steersman.twin.drills import DrillError, DrillStep, parse_drills
from steersman.twin.results import FAILED, OK
from steersman.twin.run import Experiment
from steersman.twin.workload import WorkloadSpecError, load_workload

FLEET = parse_fleet({"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "count": 2, "pool": "h"}]}})
KILL_AT = 10.0


def _spec(shared_dir, drills=None, limit=300, speed=1.0):
    spec = {"model": "llama-3.1-8b", "sources": [
        {"kind": "trace", "path": str(shared_dir / "traces" / "azure-llm-2023-conv.csv"), "slo": "standard",
         "limit": limit, "speed": speed}]}
    if drills is not None:
        spec["drills"] = drills
    return spec


def _run(shared_dir, drills, policy="round-robin", reliability=None, **kw):
    exp = Experiment(FLEET, _spec(shared_dir, drills, **kw), reliability=reliability)
    s = exp.run(policy)
    c = exp.last.arrays()
    return s, c


def test_parse_accepts_the_documented_forms():
    steps = parse_drills([{"at": "2m", "restore": "a"}, {"at": 120, "kill": "a"},
                          {"at": "300s", "slow": {"replica": 1, "factor": 5}},
                          {"at": "250ms", "errors": {"replica": "b", "rate": 0.3}}])
    assert steps == (DrillStep(120.0, "restore", "a"), DrillStep(120.0, "kill", "a"),
                     DrillStep(300.0, "slow", 1, 5.0), DrillStep(0.25, "errors", "b", 0.3))


@pytest.mark.parametrize("drills, field", [
    ([{"kill": "a"}], "drills[0].at is required"),
    ([{"at": "soon", "kill": "a"}], "drills[0].at must be a time"),
    ([{"at": -1, "kill": "a"}], "drills[0].at must be a time >= 0"),
    ([{"at": 1}], "drills[0] needs exactly one action"),
    ([{"at": 1, "kill": "a", "restore": "a"}], "drills[0] needs exactly one action"),
    ([{"at": 1, "explode": "a"}], "drills[0]: unknown field(s) ['explode']"),
    ([{"at": 1, "kill": "a"}, {"at": 2, "slow": {"replica": "a", "factor": 0.5}}], "drills[1].slow.factor must be a number >= 1"),
    ([{"at": 1, "errors": {"replica": "a", "rate": 1.5}}], "drills[0].errors.rate must be a number in [0, 1]"),
    ([{"at": 1, "errors": {"rate": 0.5}}], "drills[0].errors.replica is required"),
    ([{"at": 1, "slow": 5}], "drills[0].slow must be a mapping"),
    ([{"at": 1, "kill": True}], "drills[0].kill must be a replica name or index"),
    ({"at": 1, "kill": "a"}, "drills must be a list"),
])
def test_bad_steps_name_the_field(drills, field):
    with pytest.raises(DrillError) as e:
        parse_drills(drills)
    assert field in str(e.value)


def test_the_workload_spec_validates_its_drills(shared_dir):
    with pytest.raises(WorkloadSpecError, match=r"drills\[0\]\.slow\.factor"):
        load_workload(_spec(shared_dir, [{"at": 5, "slow": {"replica": 0, "factor": "fast"}}]))


def test_an_unknown_replica_fails_before_the_run(shared_dir):
    with pytest.raises(DrillError, match=r"drills\[0\]\.kill: unknown replica 'h100-9'; the fleet's replicas: \['h-h100-sxm-0', 'h-h100-sxm-1'\]"):
        Experiment(FLEET, _spec(shared_dir, [{"at": 5, "kill": "h100-9"}])).run("round-robin")
    with pytest.raises(DrillError, match=r"drills\[0\]\.kill: replica index 2 is out of range"):
        Experiment(FLEET, _spec(shared_dir, [{"at": 5, "kill": 2}])).run("round-robin")


def test_kill_loses_the_requests_in_flight_there_and_reroutes_the_rest(shared_dir):
    """Without the gateway's reliability mechanisms (retries, continuation) the requests in flight on the
    dead replica fail; the gateway stops routing there."""
    busy = {"limit": 400, "speed": 4.0}
    _, base = _run(shared_dir, None, **busy)
    on0 = (base["replica"] == 0) & (base["dispatch"] < KILL_AT) & (base["finish"] > KILL_AT)
    expected_lost = int(on0.sum())
    assert expected_lost >= 2  # the drill must hit something
    s, c = _run(shared_dir, [{"at": f"{KILL_AT}s", "kill": "h-h100-sxm-0"}], reliability=False, **busy)
    failed = c["status"] == FAILED
    lost_at_kill = failed & (c["finish"] == KILL_AT)
    assert int(lost_at_kill.sum()) == expected_lost  # exactly the ones in flight on the dead replica
    assert s["failed"] <= expected_lost + 1  # at most one more: the dispatch that detects the death
    assert set(c["replica"][failed].tolist()) == {0}
    later = c["arrival"] > KILL_AT + 1.0
    assert later.sum() > 50 and (c["status"][later] == OK).all() and (c["replica"][later] == 1).all()
    assert s["drills"] == [{"at_s": KILL_AT, "action": "kill", "replica": "h-h100-sxm-0", "value": None}]
    rows = s["timeline"]["windows"]
    assert sum(r["failed"] for r in rows) == s["failed"]
    assert sum(r["completed"] for r in rows) == s["completed"] and sum(r["arrived"] for r in rows) == s["requests"]
    assert s["per_replica"][0]["failed"] == s["failed"] and s["per_replica"][1]["failed"] == 0


def test_with_drills_the_twin_retries_and_continues_as_the_live_gateway(shared_dir):
    """A drill runs the gateway's reliability mechanisms by default: the streams under way on the killed
    replica continue on the other one (token-exactly: every request gets all its output, its TTFT stands),
    even when that one is at its adaptive concurrency limit (a resumed stream is not new work); nothing fails."""
    busy = {"limit": 400, "speed": 4.0}
    _, base = _run(shared_dir, None, **busy)
    on0 = (base["replica"] == 0) & (base["dispatch"] < KILL_AT) & (base["finish"] > KILL_AT)
    s, c = _run(shared_dir, [{"at": f"{KILL_AT}s", "kill": "h-h100-sxm-0"}], **busy)
    assert s["failed"] == 0 and s["completed"] == 400 and s["retries"]["continued"] == on0.sum() >= 5
    moved = on0
    assert (c["replica"][moved] == 1).all() and (c["output"][moved] == base["output"][moved]).all()
    assert (c["first"][moved] == base["first"][moved]).all() and (c["finish"][moved] > KILL_AT).all()
    s2, c2 = _run(shared_dir, [{"at": 20, "errors": {"replica": 1, "rate": 0.5}}, {"at": 40, "restore": 1}])
    assert s2["failed"] == 0 and (c2["status"] == OK).all()  # each failed dispatch retried on replica 0


def _ttft_p50(c, replica, t0, t1):
    sel = (c["replica"] == replica) & (c["arrival"] >= t0) & (c["arrival"] < t1) & (c["status"] == OK)
    assert sel.sum() >= 10
    return float(np.median((c["first"] - c["arrival"])[sel]))


def test_slow_raises_ttft_on_that_replica_and_restore_ends_it(shared_dir):
    _, base = _run(shared_dir, None)
    _, c = _run(shared_dir, [{"at": 20, "slow": {"replica": "h-h100-sxm-0", "factor": 5}}, {"at": 40, "restore": 0}])
    windows = ((0, 20), (21, 40), (45, 70))  # before, during, after (round-robin: the same requests go there)
    before, during, after = (_ttft_p50(c, 0, *w) for w in windows)
    base_before, base_during, base_after = (_ttft_p50(base, 0, *w) for w in windows)
    assert before == base_before
    assert during > 3 * base_during and during > 3 * _ttft_p50(c, 1, 21, 40)
    assert abs(after / base_after - 1) < 0.1  # restored: as if nothing had happened
    assert (c["status"] == OK).all()


def test_errors_fail_a_share_of_dispatches_there_until_restored(shared_dir):
    s, c = _run(shared_dir, [{"at": 20, "errors": {"replica": 1, "rate": 0.5}}, {"at": 40, "restore": "h-h100-sxm-1"}],
                reliability=False)
    failed = c["status"] == FAILED
    assert set(c["replica"][failed].tolist()) == {1}
    assert ((c["dispatch"][failed] >= 20) & (c["dispatch"][failed] < 40)).all()
    there = (c["replica"] == 1) & (c["dispatch"] >= 20) & (c["dispatch"] < 40)
    assert 0.25 < failed[there].mean() < 0.75
    assert s["failed"] == int(failed.sum())


def test_a_killed_replica_restarts_cold_and_takes_traffic_again(shared_dir):
    _, c = _run(shared_dir, [{"at": 20, "kill": 0}, {"at": 30, "restore": 0}])
    back = (c["replica"] == 0) & (c["dispatch"] > 30)
    assert back.sum() > 20 and (c["status"][back] == OK).all()
    first_back = c["dispatch"][back].min()
    assert first_back > 30.5  # the weights load before it is routable again
    # nothing went there while it was down (after the one dispatch that detected it)
    down = (c["replica"] == 0) & (c["dispatch"] > 20) & (c["dispatch"] < first_back)
    assert down.sum() <= 1


def test_a_restored_replica_takes_traffic_once_warm_not_after_its_ejection(shared_dir):
    """A drill audit (examples/twin-fleet.yaml, the conversation trace 8x): the kill's failures ejected replica 0
    for 30 s (outlier detection), and restored at 15 s it took no traffic in the whole 33 s run, its weights warm
    at 23 s.  The scraper's checks failed while it was dead and pass once it serves again: a restart, which lifts
    the ejection (``ReplicaGuard.health``), as the live gateway's scraper does."""
    from steersman.fleet.config import load_fleet
    fleet = load_fleet(Path(__file__).resolve().parents[2] / "examples" / "twin-fleet.yaml")
    spec = {"model": "llama-3.1-8b", "sources": [
        {"kind": "trace", "path": str(shared_dir / "traces" / "azure-llm-2023-conv.csv"), "slo": "standard",
         "speed": 8, "limit": 1000}], "drills": [{"at": 5, "kill": 0}, {"at": 15, "restore": 0}]}
    exp = Experiment(fleet, spec)
    exp.run("steersman")
    c = exp.last.arrays()
    back = (c["replica"] == 0) & (c["dispatch"] > 15)
    assert back.sum() > 20 and (c["status"][back] == OK).all()
    assert 15.5 < c["dispatch"][back].min() < 25  # weights loaded, then routable: not at 35 s


def test_the_run_lasts_until_its_last_request_ended_not_its_last_event(shared_dir):
    """``duration_s`` (and with it cost, throughput, goodput): a drill step long after the trace's last request
    billed the fleet until then (a kill at 5,000 s in a 34 s replay: 5,000 s), and the workload's 1 s pull cadence
    rounded every run up to the next second."""
    s, c = _run(shared_dir, None)
    last = float(np.max(c["finish"]))
    assert s["duration_s"] == pytest.approx(last)
    late, _ = _run(shared_dir, [{"at": 5000, "kill": 1}])
    assert late["duration_s"] == pytest.approx(last) and late["cost_usd"] == pytest.approx(s["cost_usd"])


def test_per_replica_counts_every_attempt_where_it_went(shared_dir):
    """A drill audit: an error drill's 35 retries showed nowhere (replica 1 read requests 70, failed 0: a request's
    row names its last replica only).  Each replica now counts the attempts sent there and those that failed."""
    s, _ = _run(shared_dir, [{"at": 20, "errors": {"replica": 1, "rate": 0.5}}, {"at": 40, "restore": 1}])
    r0, r1 = s["per_replica"]
    assert r1["failed_attempts"] > 5 and r0["failed_attempts"] == 0
    assert r1["attempts"] == r1["requests"] + r1["failed_attempts"]  # each failure there was retried on replica 0
    assert r0["attempts"] + r1["attempts"] == s["retries"]["attempts"]


def test_drain_takes_a_replica_out_of_rotation_its_requests_finish_and_resume_puts_it_back(shared_dir):
    """An operator's drain (POST /admin/replicas/{name}/drain live): nothing is dispatched there until resumed, the
    requests under way there finish (none fails), and afterwards it takes traffic again."""
    _, c = _run(shared_dir, [{"at": 30, "drain": 0}, {"at": 55, "resume": "h-h100-sxm-0"}])
    assert (c["status"] == OK).all()
    on0 = c["replica"] == 0
    assert (on0 & (c["dispatch"] < 30)).sum() > 20
    assert not (on0 & (c["dispatch"] > 30) & (c["dispatch"] < 55)).any()
    assert ((~on0) & (c["dispatch"] > 30) & (c["dispatch"] < 55)).sum() > 40  # the other one took them
    assert (on0 & (c["dispatch"] < 30) & (c["finish"] > 30)).any()  # under way at the drain: finished there
    assert (on0 & (c["dispatch"] > 55)).sum() > 20


def test_drain_and_resume_parse_as_replica_steps():
    assert parse_drills([{"at": 1, "drain": "a"}, {"at": 2, "resume": 3}]) == (
        DrillStep(1.0, "drain", "a"), DrillStep(2.0, "resume", 3))
    with pytest.raises(DrillError, match=r"drills\[0\].drain must be a replica name or index"):
        parse_drills([{"at": 1, "drain": {"replica": 0}}])
