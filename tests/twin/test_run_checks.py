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
