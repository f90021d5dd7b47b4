"""What `steersman simulate` and `steersman plan` refuse, and how they say it (an audit of the twin's commands as
a capacity planner uses them, thirty-fourth session): each a one-line error naming the problem, before any run,
never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from steersman.cli import app
from steersman.twin.report import table
from steersman.twin.workload.trace_data import TraceError, load_trace

ROOT = Path(__file__).resolve().parents[2]
FLEET = str(ROOT / "examples" / "twin-fleet.yaml")


def _invoke(argv):
    return CliRunner().invoke(app, argv, env={"COLUMNS": "200"})


def _refused(argv, says):
    r = _invoke(argv)
    assert r.exit_code == 2 and says in r.output.replace("\n", " "), r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r


def test_markup_in_a_value_is_printed_as_it_is_not_a_rich_traceback(tmp_path):
    wl = tmp_path / "w.yaml"
    wl.write_text("model: llama-3.1-8b\nduration_s: 5\nsources: [{kind: chatbot, tasks_per_s: 1, slo: '[/]'}]\n")
    _refused(["simulate", "--fleet", FLEET, "--workload", str(wl), "--out", str(tmp_path / "o")], "[/]")
    wl.write_text("model: llama-3.1-8b\nduration_s: 5\nsources: [{kind: copilot, tasks_per_s: 1, calls: [20, 10]}]\n")
    _refused(["simulate", "--fleet", FLEET, "--workload", str(wl), "--out", str(tmp_path / "o")], "[min, max]")


@pytest.mark.parametrize("users", [0, -5])
def test_a_population_of_no_users_is_named_whatever_the_load(tmp_path, users):
    wl = tmp_path / "w.yaml"
    wl.write_text(f"model: llama-3.1-8b\nduration_s: 5\nsources: [{{kind: chatbot, users: {users}}}]\n")
    _refused(["simulate", "--fleet", FLEET, "--workload", str(wl), "--out", str(tmp_path / "o")], "users must be >= 1")


def test_an_out_that_cannot_be_a_directory_is_refused_before_the_runs(tmp_path):
    wl = tmp_path / "w.yaml"
    wl.write_text("model: llama-3.1-8b\nduration_s: 5\nsources: [{kind: chatbot, tasks_per_s: 1}]\n")
    afile = tmp_path / "afile"
    afile.write_text("x")
    r = _refused(["simulate", "--fleet", FLEET, "--workload", str(wl), "--out", str(afile)], "steersman simulate:")
    assert "File exists" in r.output and "%" not in r.output  # no progress bar: nothing ran


def test_a_trace_limit_of_zero_is_refused_not_run_as_nothing(tmp_path, shared_dir):
    trace = str(shared_dir / "traces" / "azure-llm-2023-conv.csv")
    _refused(["simulate", "--fleet", FLEET, "--trace", trace, "--limit", "0", "--out", str(tmp_path / "o")],
             "limit must be >= 1")


@pytest.mark.parametrize("name, text, where, says", [
    ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,-5,3\n", r"t\.csv:2: bad row",
     "ContextTokens must be >= 0"),
    ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,5,-3\n", r"t\.csv:2: bad row",
     "GeneratedTokens must be >= 0"),
    ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,5\n", r"t\.csv:2: bad row",
     "2 column(s), expected 3"),
    ("t.jsonl", '[1, 2]\n', r"t\.jsonl:1: bad record", "a record is a JSON object"),
    ("t.jsonl", '{"timestamp": 0, "output_length": 3, "hash_ids": []}\n', r"t\.jsonl:1: bad record",
     "missing field(s) input_length"),
    ("t.jsonl", '{"timestamp": 0, "input_length": -1, "output_length": 3, "hash_ids": []}\n',
     r"t\.jsonl:1: bad record", "input_length must be >= 0"),
])
def test_trace_records_a_trace_cannot_hold_are_named(tmp_path, name, text, where, says):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(TraceError, match=where) as e:
        load_trace(p)
    assert says in str(e.value)


def test_a_trace_of_another_extension_says_how_to_name_its_format(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("x")
    with pytest.raises(TraceError, match="name it .csv"):
        load_trace(p)


def test_plan_refuses_what_it_cannot_size_with_the_reason(tmp_path):
    wl = tmp_path / "w.yaml"
    wl.write_text("model: llama-3.1-70b\nduration_s: 5\nsources: [{kind: chatbot, tasks_per_s: 1},"
                  " {kind: chatbot, tasks_per_s: 1, model: llama-3.1-8b}]\n")
    _refused(["plan", "--workload", str(wl), "--gpus", "H100", "--tp", "4"], "plan sizes a fleet of one model")
    wl.write_text("model: llama-3.1-8b\nduration_s: 5\nsources: [{kind: chatbot, tasks_per_s: 1}]\n"
                  "drills: [{at: 2, kill: 0}]\n")
    _refused(["plan", "--workload", str(wl), "--gpus", "H100"], "the workload has drills")
    wl.write_text("model: llama-3.1-8b\nduration_s: 5\nsources: [{kind: chatbot, tasks_per_s: 1}]\n")
    _refused(["plan", "--workload", str(wl), "--fleet", str(tmp_path / "nope.yaml")],
             "cannot read fleet file")


def test_the_table_shows_the_unfinished_tasks_beside_the_tasks_ok():
    from rich.console import Console

    con = Console(width=300, record=True)
    con.print(table({"steersman": {1.0: {"task_success_rate": 0.5, "tasks_unfinished": 129}}}))
    text = con.export_text()
    assert "unfinished" in text and "129" in text


def test_without_policy_the_fleet_files_own_routing_profile_runs(tmp_path, monkeypatch):
    """`simulate --fleet F` ran `steersman` whatever F's `policy:` named, and `plan --fleet F` planned with it: the
    twin answered "what if" about another control plane than the one the file configures (architecture audit,
    thirty-fifth session)."""
    import json

    import yaml

    from steersman.twin import plan as plan_mod

    doc = yaml.safe_load(Path(FLEET).read_text())
    doc["policy"] = "least-request"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(doc))
    wl = tmp_path / "w.yaml"
    wl.write_text("model: llama-3.1-8b\nduration_s: 2\nsources: [{kind: chatbot, tasks_per_s: 1}]\n")
    r = _invoke(["simulate", "--fleet", str(fleet), "--workload", str(wl), "--out", str(tmp_path / "o"), "--no-plots"])
    assert r.exit_code == 0, r.output
    assert list(json.loads((tmp_path / "o" / "results.json").read_text())["policies"]) == ["least-request"]
    r = _invoke(["simulate", "--fleet", str(fleet), "--workload", str(wl), "--out", str(tmp_path / "p"), "--no-plots",
                 "--policy", "round-robin"])
    assert r.exit_code == 0 and list(json.loads((tmp_path / "p" / "results.json").read_text())["policies"]) == \
        ["round-robin"], r.output
    used = []
    real = plan_mod._Twin

    def spy(*a):
        used.append(a[-1])  # the policy every trial runs
        return real(*a)

    monkeypatch.setattr(plan_mod, "_Twin", spy)
    r = _invoke(["plan", "--workload", str(wl), "--gpus", "A100", "--fleet", str(fleet)])
    assert used == ["least-request"], (used, r.output)
