"""`steersman simulate` with drills end to end, and results.json's keys exactly as the README documents them."""

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from steersman.cli import app

ROOT = Path(__file__).resolve().parents[2]


def _documented() -> tuple[set[str], set[str]]:
    """Backticked keys in the first column of the README's results.json tables (meta.*, and RUN keys)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("### results.json")
    end = text.index("\n### ", start + 1)
    meta, run = set(), set()
    for line in text[start:end].splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        if first.strip().endswith(" key"):  # a table's header row
            continue
        for key in re.findall(r"`([^`]+)`", first):
            (meta if key.startswith("meta.") else run).add(key)
    return meta, run


def _flatten(v, prefix: str = "") -> set[str]:
    if isinstance(v, dict):
        out = set()
        for k, x in v.items():
            nested = isinstance(x, dict) or (isinstance(x, list) and any(isinstance(y, dict) for y in x))
            out |= _flatten(x, f"{prefix}{k}.") if nested and x else {f"{prefix}{k}"}
        return out
    if isinstance(v, list):
        out = set()
        for x in v:
            out |= _flatten(x, prefix[:-1] + "[].")
        return out
    return {prefix[:-1]}


def _simulate(tmp_path: Path, shared_dir: Path, drills: str) -> tuple[int, str]:
    spec = tmp_path / "w.yaml"
    spec.write_text(f"""model: llama-3.1-8b
sources:
  - {{kind: trace, path: {shared_dir / 'traces' / 'azure-llm-2023-conv.csv'}, slo: standard, limit: 200, speed: 4}}
drills:
{drills}
""")
    fleet = tmp_path / "f.yaml"
    fleet.write_text("simulated:\n  replicas:\n    - {gpu: H100, model: llama-3.1-8b, count: 2, pool: p}\n")
    r = CliRunner().invoke(app, ["simulate", "--fleet", str(fleet), "--workload", str(spec), "--policy", "steersman",
                                 "--policy", "round-robin", "--out", str(tmp_path / "out"), "--no-plots"])
    return r.exit_code, r.output


def test_results_json_has_exactly_the_documented_keys(tmp_path, shared_dir):
    code, out = _simulate(tmp_path, shared_dir, "  - {at: 10s, kill: p-h100-sxm-0}\n  - {at: 20s, restore: 0}")
    assert code == 0, out
    assert "goodput per" in out and "kill p-h100-sxm-0" in out  # the drill timeline is printed
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    meta, run = _documented()
    assert {f"meta.{k}" for k in _flatten(doc["meta"])} == meta
    assert set(doc["policies"]) == {"steersman", "round-robin"}
    for policy, by_load in doc["policies"].items():
        assert set(by_load) == {"1"}
        s = by_load["1"]
        optional = {k for k in run if k.startswith("users_rounded")}  # (only when a population was rounded)
        assert _flatten(s) - optional == run - optional and _flatten(s) <= run, policy
        assert [d["action"] for d in s["drills"]] == ["kill", "restore"]
        # the kill moved the dead replica's streams (the gateway's continuation): nothing failed
        assert s["retries"]["continued"] + s["retries"]["retried"] >= 1 and s["failed"] == 0, s["retries"]


def test_a_bad_drill_is_refused_with_the_field_named(tmp_path, shared_dir):
    code, out = _simulate(tmp_path, shared_dir, "  - {at: 10s, slow: {replica: 0, factor: 0.5}}")
    assert code == 2 and "drills[0].slow.factor must be a number >= 1" in out
    code, out = _simulate(tmp_path, shared_dir, "  - {at: 10s, kill: nope}")
    assert code == 2 and "drills[0].kill: unknown replica 'nope'" in out and "p-h100-sxm-0" in out
