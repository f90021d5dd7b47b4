"""`steersman simulate` and `plan` refuse what would fail (or silently run nothing) before any run, naming it."""

import json
import subprocess
import sys

import pytest

from steersman.fleet.config import parse_fleet
from steersman.twin.run import Experiment, read_spec, scale_spec
from steersman.twin.workload import WorkloadSpecError

STEERSMAN = [sys.executable, "-m", "steersman"]
FLEET = {"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "count": 1}]}}


def _spec(model="llama-3.1-8b", **source) -> dict:
    return {"model": model, "duration_s": 5, "sources": [{"kind": "chatbot", "tasks_per_s": 1, **source}]}


def test_a_workload_asking_for_a_model_the_fleet_does_not_serve_is_refused():
    exp = Experiment(parse_fleet(FLEET), _spec("qwen2.5-7b"))
    with pytest.raises(WorkloadSpecError, match="asks for model 'qwen2.5-7b'.*it serves: llama-3.1-8b"):
        exp.check(["steersman"])
    Experiment(parse_fleet(FLEET), _spec()).check(["steersman", "round-robin"])


def test_an_unknown_policy_is_refused_before_any_run():
    with pytest.raises(KeyError, match="unknown routing policy"):
        Experiment(parse_fleet(FLEET), _spec()).check(["steersman", "nope"])


def test_scaling_leaves_a_wrong_value_for_the_spec_parser_to_name():
    spec = _spec(tasks_per_s="lots")
    assert scale_spec(spec, 2.0)["sources"][0]["tasks_per_s"] == "lots"
    assert scale_spec(_spec(), 2.0)["sources"][0]["tasks_per_s"] == 2.0
    with pytest.raises(WorkloadSpecError, match=r"sources\[0\].tasks_per_s must be a finite number, got 'lots'"):
        Experiment(parse_fleet(FLEET), spec).check()


def test_drills_are_checked_against_the_fleet_and_the_workloads_end():
    from steersman.twin.drills import DrillError

    fleet = parse_fleet(FLEET)
    Experiment(fleet, {**_spec(), "drills": [{"at": "2s", "kill": "default-h100-sxm-0"}]}).check()
    with pytest.raises(DrillError, match="unknown replica 'nosuch'"):
        Experiment(fleet, {**_spec(), "drills": [{"at": "2s", "kill": "nosuch"}]}).check()
    with pytest.raises(WorkloadSpecError, match=r"drills\[0\].at \(100 s\) is after the workload's end \(5 s\)"):
        Experiment(fleet, {**_spec(), "drills": [{"at": "100s", "kill": "default-h100-sxm-0"}]}).check()


def test_a_workload_file_that_is_not_yaml_of_a_mapping_is_named(tmp_path):
    bad = tmp_path / "w.yaml"
    bad.write_text("model: [1\n")
    with pytest.raises(WorkloadSpecError, match="w.yaml: invalid YAML"):
        read_spec(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(WorkloadSpecError, match="is a mapping"):
        read_spec(bad)


def test_simulate_says_what_is_wrong_and_writes_nothing(tmp_path):
    fleet, wl, out = tmp_path / "fleet.yaml", tmp_path / "w.yaml", tmp_path / "out"
    fleet.write_text(json.dumps(FLEET))
    wl.write_text(json.dumps(_spec("qwen2.5-7b")))
    r = subprocess.run(STEERSMAN + ["simulate", "--fleet", str(fleet), "--workload", str(wl), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no replica of the fleet serves" in r.stdout and "Traceback" not in r.stderr
    assert not out.exists()
    fleet.write_text(json.dumps({"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "tp": 3}]}}))
    r = subprocess.run(STEERSMAN + ["simulate", "--fleet", str(fleet), "--workload", str(wl), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "simulated.replicas[0]" in r.stdout and "attention heads" in r.stdout


def test_plan_refuses_a_bad_tensor_parallel_and_says_when_no_fleet_meets_the_slo(tmp_path):
    wl = tmp_path / "w.yaml"
    wl.write_text(json.dumps(_spec()))
    r = subprocess.run(STEERSMAN + ["plan", "--workload", str(wl), "--tp", "0"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "tensor_parallel must be an integer >= 1, got 0" in r.stdout
    wl.write_text(json.dumps(_spec("llama-3.1-70b")))  # fits neither type at tp 1: no run at all
    r = subprocess.run(STEERSMAN + ["plan", "--workload", str(wl), "--gpus", "L40S,A100"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "does not fit on 1 x L40S" in r.stdout and "no fleet of L40S,A100 meets" in r.stdout
    bad = tmp_path / "f.yaml"
    bad.write_text("scheduler: {bogus: 1}\n")  # a typo in the base fleet is an error, not an infeasible GPU type
    r = subprocess.run(STEERSMAN + ["plan", "--workload", str(wl), "--fleet", str(bad)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "bogus" in r.stdout and "Traceback" not in r.stderr


def test_a_spec_block_size_other_than_the_engines_is_refused():
    from steersman.config import DEFAULTS

    fleet, bs = parse_fleet(FLEET), DEFAULTS.engine.block_size
    Experiment(fleet, {**_spec(), "block_size": bs}).check()
    for other in (bs // 2, bs * 2):  # half: every request failed; double: half the prefix hits, both silently
        exp = Experiment(fleet, {**_spec(), "block_size": other})
        with pytest.raises(WorkloadSpecError, match=rf"block_size must be {bs}, the engines'.*got {other}"):
            exp.check()
        with pytest.raises(WorkloadSpecError, match="block_size"):  # a run without check (steersman plan's trials)
            exp.run("steersman")


def test_a_workload_that_never_ends_is_refused_unless_something_ends_it():
    fleet = parse_fleet(FLEET)

    def spec(**source):
        return {"model": "llama-3.1-8b", "sources": [{"kind": "chatbot", **source}]}

    with pytest.raises(WorkloadSpecError, match="'chatbot' never ends: set duration_s, end_s, max_tasks or --duration"):
        Experiment(fleet, spec(tasks_per_s=1)).check()
    with pytest.raises(WorkloadSpecError, match="never ends: set duration_s, end_s, tasks_per_user or --duration"):
        Experiment(fleet, spec(users=2)).check()
    Experiment(fleet, spec(tasks_per_s=1), duration_s=5).check()
    for ends in (dict(tasks_per_s=1, max_tasks=3), dict(tasks_per_s=1, end_s=5), dict(users=2, tasks_per_user=1)):
        Experiment(fleet, spec(**ends)).check()


def test_duration_replaces_the_specs_duration_s_so_it_can_lengthen_a_run():
    fleet = parse_fleet(FLEET)
    spec = {"model": "llama-3.1-8b", "duration_s": 4, "sources": [{"kind": "chatbot", "tasks_per_s": 2, "calls": 1}]}
    short = Experiment(fleet, spec, seed=0).run("round-robin")["requests"]
    long = Experiment(fleet, spec, seed=0, duration_s=16).run("round-robin")["requests"]
    assert long > 2.5 * short


def test_the_specs_seed_is_used_unless_one_is_given():
    fleet = parse_fleet(FLEET)
    spec = {**_spec(), "seed": 7}

    def arrivals(exp):
        exp.run("round-robin")
        return exp.last.arrays()["arrival"].tolist()

    assert Experiment(fleet, spec).used_seed == 7 and Experiment(fleet, _spec()).used_seed == 0
    assert arrivals(Experiment(fleet, spec)) == arrivals(Experiment(fleet, spec, seed=7)) != arrivals(
        Experiment(fleet, spec, seed=0))


def test_load_scales_users_to_whole_users_and_a_run_says_by_how_much():
    fleet = parse_fleet(FLEET)
    spec = {"model": "llama-3.1-8b", "duration_s": 4, "sources": [
        {"kind": "chatbot", "users": 3, "think_s": 1}, {"kind": "copilot", "tasks_per_s": 1, "max_tasks": 2}]}
    exp = Experiment(fleet, spec, seed=0)
    assert exp.run("round-robin", 0.5)["users_rounded"] == [{"source": "chatbot", "users": 2,  # 1.5 users: 2
                                                              "factor": pytest.approx(2 / 3)}]
    assert "users_rounded" not in exp.run("round-robin", 2.0)  # 6 users: exactly 2x
    trace = {"model": "m", "sources": [{"kind": "trace", "path": "t.csv", "speed": None}]}
    assert scale_spec(trace, 2.0)["sources"][0]["speed"] == 2.0  # null is 1x, scaled like any speed
    half_user = _spec(users=2.5)
    del half_user["sources"][0]["tasks_per_s"]
    assert scale_spec(half_user, 1.0)["sources"][0]["users"] == 2.5  # not rounded into a valid spec
    with pytest.raises(WorkloadSpecError, match=r"sources\[0\].users must be an integer, got 2.5"):
        Experiment(fleet, half_user).check()


def test_simulate_and_plan_refuse_bad_flags_and_specs_and_record_the_seed(tmp_path):
    fleet, wl, out = tmp_path / "fleet.yaml", tmp_path / "w.yaml", tmp_path / "out"
    fleet.write_text(json.dumps(FLEET))
    wl.write_text(json.dumps({**_spec(), "seed": 7}))
    sim = STEERSMAN + ["simulate", "--fleet", str(fleet), "--workload", str(wl), "--out", str(out), "--no-plots"]
    for flags, said in ((["--duration", "-5"], "--duration must be a number of seconds > 0, got -5"),
                        (["--duration", "nan"], "--duration must be a number of seconds > 0, got nan"),
                        (["--load", ","], "--load: no multiplier"),
                        (["--load", "1,0"], "--load multipliers must be finite numbers > 0, got 0"),
                        (["--load", "inf"], "--load multipliers must be finite numbers > 0, got inf"),
                        (["--load", "x"], "--load: 'x' is not a number")):
        r = subprocess.run(sim + flags, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and said in r.stdout and "Traceback" not in r.stderr, (flags, r.stdout, r.stderr)
    assert not out.exists()
    r = subprocess.run(sim, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((out / "results.json").read_text())["meta"]["seed"] == 7  # the spec's, without --seed
    for spec, said in (({**_spec(), "block_size": 8}, "block_size must be"),
                       ({**_spec(), "duration_s": None}, "'chatbot' never ends")):
        wl.write_text(json.dumps(spec))
        r = subprocess.run(STEERSMAN + ["plan", "--workload", str(wl), "--gpus", "L40S"], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and said in r.stdout and "Traceback" not in r.stderr, (r.stdout, r.stderr)


def test_the_twin_runs_with_the_fleet_files_gateway_and_admission_settings(monkeypatch):
    """The twin scraped at the default cadence, detected a dead replica after the default count of failed checks and
    gave a tenant that names no class `standard`, whatever the fleet file set (architecture audit, thirty-fifth
    session): a fleet whose open traffic is `sheddable` was never shed in the twin."""
    from steersman.policy.request import PriorityClass
    from steersman.twin import run as run_mod

    made = []

    class Spy(run_mod.Twin):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(run_mod, "Twin", Spy)
    doc = {**FLEET, "gateway": {"metrics_interval_s": 0.2, "unhealthy_after_failures": 7},
           "admission": {"default_priority": "sheddable"}}
    spec = _spec(tenant="plain")
    spec["sources"].append({"kind": "chatbot", "tasks_per_s": 1, "tenant": "vip"})
    spec["tenants"] = {"vip": {"priority": "critical"}, "plain": {}}
    Experiment(parse_fleet(doc), spec).run("steersman")
    (tw,) = made
    assert (tw.cfg.metrics_interval_s, tw.cfg.unhealthy_after_failures) == (0.2, 7)
    prio = {name: t.priority for name, t in tw.tenants.items()}
    assert prio == {"vip": PriorityClass.CRITICAL, "plain": PriorityClass.SHEDDABLE}
    assert tw._tenant("stranger").priority is PriorityClass.SHEDDABLE
    made.clear()
    Experiment(parse_fleet(doc), _spec(tenant="web")).run("steersman")  # no tenants listed: the source's own
    assert made[0].tenants["web"].priority is PriorityClass.SHEDDABLE
