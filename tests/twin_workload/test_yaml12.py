"""A workload spec is read as the fleet file is (steersman.config._yaml.load_yaml): a key given twice is an error
naming it and its lines (plain yaml.safe_load kept the last one silently), numbers are YAML 1.2's (`1e3` a number,
not the string a rate or a deadline refused; `010` ten, not octal eight), the same in `simulate` / `plan
--workload` (twin.run.read_spec) and load_workload."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from steersman.twin.run import read_spec
from steersman.twin.workload import WorkloadSpecError, load_workload

_SPEC = """\
model: llama-3.1-8b
duration_s: 6e2
sources:
  - kind: copilot
    name: {name}
    tasks_per_s: 1e-1
    deadline_s: 3e1
    system_prompt_tokens: 0o17
    retries: 010
"""


def _write(tmp_path, text: str, name: str = "w.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_the_fleet_file_and_a_workload_spec_share_one_loader():
    from steersman.config._yaml import load_yaml
    from steersman.fleet._config_checks import load_yaml as fleet_load_yaml

    assert fleet_load_yaml is load_yaml


@pytest.mark.parametrize("read", [load_workload, lambda p: load_workload(*read_spec(p)[:1], base_dir=p.parent)],
                         ids=["load_workload", "read_spec"])
def test_numbers_in_a_workload_spec_are_read_as_yaml_1_2_reads_them(tmp_path, read):
    """`tasks_per_s: 1e-1` was the string '1e-1' (refused: must be a finite number), `retries: 010` eight."""
    p = _write(tmp_path, _SPEC.format(name="'on'"))
    (src,) = read(p).sources
    assert src.name == "on"  # quoted: a string, as in the fleet file
    got = {k: src.params[k] for k in ("tasks_per_s", "deadline_s", "end_s", "system_prompt_tokens", "retries")}
    assert got == {"tasks_per_s": 0.1, "deadline_s": 30.0, "end_s": 600.0, "system_prompt_tokens": 15, "retries": 10}


def test_a_rate_of_1e3_is_a_number(tmp_path):
    p = _write(tmp_path, "model: m\nduration_s: 1\nsources: [{kind: chatbot, tasks_per_s: 1e3}]\n")
    (src,) = load_workload(p).sources
    assert src.params["tasks_per_s"] == 1000.0


@pytest.mark.parametrize("read", [load_workload, read_spec], ids=["load_workload", "read_spec"])
def test_a_key_given_twice_in_a_workload_spec_is_refused_naming_it_and_the_file(tmp_path, read):
    p = _write(tmp_path, """\
        model: m
        duration_s: 60
        sources:
          - kind: copilot
            tasks_per_s: 1
            tasks_per_s: 50
        """)
    with pytest.raises(WorkloadSpecError, match=r"w\.yaml: invalid YAML: .*duplicate key 'tasks_per_s' on line 6 "
                                                r"\(first given on line 5\)"):
        read(p)
    p = _write(tmp_path, "model: m\nsources: [{kind: copilot, tasks_per_s: 1}]\nmodel: n\n")
    with pytest.raises(WorkloadSpecError, match=r"w\.yaml: invalid YAML: .*duplicate key 'model' on line 3"):
        read(p)


def test_a_merge_key_may_still_be_overridden(tmp_path):
    p = _write(tmp_path, """\
        model: m
        duration_s: 60
        sources:
          - &base {kind: copilot, name: a, tasks_per_s: 1}
          - {<<: *base, name: b, tasks_per_s: 2}
        """)
    a, b = load_workload(p).sources
    assert (a.name, a.params["tasks_per_s"], b.name, b.params["tasks_per_s"]) == ("a", 1.0, "b", 2.0)


def test_a_name_yaml_reads_as_a_boolean_or_a_number_says_to_quote_it(tmp_path):
    """`on` is a boolean to the fleet file's loader too (its booleans are YAML 1.1's), `1e3` now a number: where a
    name is expected the error names the field and says to quote it; quoted, it is the name."""
    for written, field in [("name: on", r"sources\[0\]\.name"), ("name: 1e3", r"sources\[0\]\.name"),
                           ("tenant: yes", r"sources\[0\]\.tenant"), ("slo: off", r"sources\[0\]\.slo")]:
        p = _write(tmp_path, f"model: m\nduration_s: 1\nsources: [{{kind: chatbot, tasks_per_s: 1, {written}}}]\n")
        with pytest.raises(WorkloadSpecError, match=rf"w\.yaml: {field}.*\(quote it"):
            load_workload(p)
    p = _write(tmp_path, "model: m\nduration_s: 1\nsources: [{kind: chatbot, tasks_per_s: 1, name: '1e3', "
                         "tenant: 'yes'}]\n")
    (src,) = load_workload(p).sources
    assert (src.name, src.tenant) == ("1e3", "yes")


def test_a_workload_spec_that_is_not_utf8_is_named(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_bytes(b"\xff\xfe" + "model: m\n".encode("utf-16-le"))
    for read in (load_workload, read_spec):
        with pytest.raises(WorkloadSpecError, match=r"cannot read .*w\.yaml: not UTF-8 text"):
            read(p)


@pytest.mark.parametrize("command", [["simulate", "--fleet", "examples/twin-fleet.yaml"], ["plan"]])
def test_the_cli_names_the_file_and_the_duplicate_key_without_a_traceback(tmp_path, command):
    w = _write(tmp_path, "model: llama-3.1-8b\nduration_s: 5\nsources:\n  - {kind: copilot, tasks_per_s: 1, "
                         "tasks_per_s: 2}\n")
    if command[0] == "simulate":  # (read as before, the file ran: its results went here, not into the checkout)
        command = [*command, "--out", str(tmp_path / "out")]
    r = subprocess.run([sys.executable, "-m", "steersman", *command, "--workload", str(w)], capture_output=True,
                       text=True, timeout=120, cwd=str(_repo()), env={**os.environ, "COLUMNS": "500"})
    out = " ".join((r.stdout + r.stderr).split())  # (rich wraps long lines: COLUMNS keeps the path on one)
    assert r.returncode == 2, out
    assert f"steersman {command[0]}: {w}: invalid YAML" in out and "duplicate key 'tasks_per_s' on line 4" in out, out
    assert "Traceback" not in out


def _repo() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parents[2]
