"""Multi-tenant mixes and the YAML workload spec (including its validation errors)."""

from __future__ import annotations

import math
import pathlib
import textwrap

import pytest

from steersman.control.tenants import TenantConfig
from steersman.policy.request import PriorityClass
from steersman.twin.workload import AgentSource, Mix, TraceSource, WorkloadSpecError, load_workload, parse_workload
from wl_helpers import content, drive


@pytest.fixture(scope="module")
def trace(shared_dir):
    return str(shared_dir / "traces" / "mooncake-synthetic.jsonl")


def test_mix_merges_in_time_order_and_routes_completions(trace):
    m = Mix([
        AgentSource("copilot", name="cp", tenant="acme", tasks_per_s=0.5, end_s=60.0, seed=1),
        AgentSource("chatbot", name="chat", tenant="free", tasks_per_s=1.0, end_s=60.0, seed=2),
        TraceSource(trace, name="mc", tenant="free", limit=200, speed=4.0),
    ], tenants={"acme": "critical", "free": PriorityClass.SHEDDABLE})
    assert [s.name for s in m.sources] == ["cp", "chat", "mc"] and [s.index for s in m.sources] == [0, 1, 2]
    assert [s.closed_loop for s in m.sources] == [True, True, False]
    assert m.tenants["acme"] == TenantConfig("acme", PriorityClass.CRITICAL)
    assert m.priority("free") is PriorityClass.SHEDDABLE
    m.start()
    batch = m.next_batch(30.0)
    assert [a.seq for a in batch] == list(range(len(batch)))
    assert all(a.time < b.time or (a.time == b.time and a.source <= b.source) for a, b in zip(batch, batch[1:]))
    assert {a.source for a in batch} == {0, 1, 2}
    seen, done = drive(m, start=False, pending=batch)
    assert m.done
    st = m.stats
    assert st.emitted == st.completed == len(seen)
    per = m.source_stats()
    assert sum(s.emitted for s in per) == st.emitted and per[2].emitted == 200
    for a, t, ok, fu in done:
        assert all(b.source == a.source and b.workflow == a.workflow for b in fu)
    loads = m.source_loads()
    assert m.offered_load().requests_per_s == pytest.approx(sum(x.requests_per_s for x in loads))
    assert set(m.tenant_loads()) == {"acme", "free"}


def test_mix_validation():
    a = AgentSource("copilot", tasks_per_s=1.0)
    with pytest.raises(ValueError, match="unique"):
        Mix([a, AgentSource("copilot", tasks_per_s=1.0)])
    with pytest.raises(ValueError, match="not listed"):
        Mix([AgentSource("copilot", tasks_per_s=1.0, tenant="x")], {"y": "batch"}, strict=True)
    m = Mix([AgentSource("copilot", tasks_per_s=1.0, tenant="x")])
    assert m.tenants["x"].priority is PriorityClass.STANDARD  # the gateway's default band
    nested = Mix([m, AgentSource("research", tasks_per_s=1.0)])
    assert [s.index for s in nested.sources] == [0, 1]


SPEC = """
model: llama-3.1-8b
duration_s: 120
tenants: {acme: {priority: critical}, free: {priority: sheddable}}
curves:
  office: {trough: 0.2, peak: 1.0, peak_hour: 14, start_hour: 13}
sources:
  - {kind: copilot, tenant: acme, tasks_per_s: 0.5, slo: interactive, system_prompt_tokens: 1500, calls: [10, 20],
     output_tokens: {dist: lognormal, mean: 200, cv: 1.0}, gap_s: {dist: exponential, mean: 1.0}, curve: office}
  - {kind: chatbot, name: chat, tenant: free, users: 20, think_s: 30, ramp_s: 10, slo: standard, max_tokens: null}
  - {kind: agent, tenant: free, tasks_per_s: 0.1, system_prompt_tokens: 300, task_tokens: 100, calls: 3,
     output_tokens: 50, tool_tokens: [10, 100], gap_s: 0.5, model: other-model}
  - {kind: trace, path: TRACE, tenant: free, speed: 2.0, slo: batch, limit: 300}
"""


def test_spec_builds_the_workload(trace, tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text(SPEC.replace("TRACE", trace))
    w = load_workload(p, seed=3)
    assert isinstance(w, Mix)
    names = [s.name for s in w.sources]
    assert names == ["copilot", "chat", "agent", "mooncake-synthetic"]
    assert [s.kind for s in w.sources] == ["copilot", "chatbot", "agent", "mooncake"]
    assert w.tenants["acme"].priority is PriorityClass.CRITICAL and w.tenants["free"].priority is PriorityClass.SHEDDABLE
    seen, _ = drive(w, until=400.0)
    by_src = {i: [a for a in seen if a.source == i] for i in range(4)}
    assert all(by_src[i] for i in range(4))
    assert {a.model for a in by_src[2]} == {"other-model"} and {a.model for a in by_src[0]} == {"llama-3.1-8b"}
    assert {a.slo_class for a in by_src[0]} == {"interactive"} and {a.slo_class for a in by_src[3]} == {"batch"}
    assert all(a.max_tokens is None for a in by_src[1])
    assert all(10 <= a.steps <= 20 for a in by_src[0])
    assert all(a.time < 120.0 for a in seen if a.step in (None, 1))  # duration_s bounds new tasks and replay
    assert len(by_src[3]) == 300
    again, _ = drive(load_workload(p, seed=3), until=400.0)
    assert [(a.time, *content(a)) for a in again] == [(a.time, *content(a)) for a in seen]
    other, _ = drive(load_workload(p, seed=4), until=400.0)
    assert [content(a) for a in other] != [content(a) for a in seen]


def test_relative_trace_paths(shared_dir, tmp_path, monkeypatch):
    spec = {"model": "m", "sources": [{"kind": "trace", "path": "traces/azure-llm-2023-code.csv", "limit": 5}]}
    w = parse_workload(spec, 0, base_dir=shared_dir)
    assert w.sources[0].params["requests"] == 5
    monkeypatch.chdir(shared_dir)
    assert parse_workload(spec, 0, base_dir=tmp_path).sources[0].kind == "azure"  # falls back to the cwd
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WorkloadSpecError, match=r"sources\[0\]\.path: trace 'traces/azure-llm-2023-code.csv' not found"):
        parse_workload(spec, 0, base_dir=tmp_path)


def _base(**src):
    body = {"kind": "copilot", "tasks_per_s": 1}
    body.update(src)
    return {"model": "m", "sources": [body]}


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"sources": []}, "sources must be a non-empty list"),
        ({"model": "m", "sources": [{"kind": "copilot", "tasks_per_s": 1}], "extra": 1}, r"unknown key\(s\) \['extra'\]"),
        ({"sources": [{"kind": "copilot", "tasks_per_s": 1}]}, r"sources\[0\]\.model: no model"),
        (_base(kind="robot"), r"sources\[0\]\.kind must be one of"),
        (_base(calls=[20, 10]), r"sources\[0\]\.calls: range \[min, max\] needs min <= max"),
        (_base(calls={"dist": "lognormal", "mean": -1}), r"sources\[0\]\.calls: mean must be > 0"),
        (_base(output_tokens={"dist": "zipf"}), r"sources\[0\]\.output_tokens: 'dist' must be one of"),
        (_base(colls=3), r"sources\[0\]: unknown field\(s\) \['colls'\]"),
        (_base(slo="urgent"), r"sources\[0\]\.slo 'urgent' is not a known class"),
        (_base(tasks_per_s=0), r"sources\[0\]\.tasks_per_s must be > 0"),
        (_base(users=5), r"sources\[0\]: give exactly one of tasks_per_s"),
        (_base(tasks_per_s=None, users=0), r"sources\[0\]\.users must be >= 1"),
        (_base(think_s=3), r"sources\[0\]\.think_s applies to a user population"),
        (_base(tasks_per_s=None, users=3, max_tasks=5), r"sources\[0\]\.max_tasks caps open-loop tasks"),
        (_base(max_tokens=0), r"sources\[0\]\.max_tokens must be >= 1"),
        (_base(max_tokens="lots"), r"sources\[0\]\.max_tokens must be an integer"),
        (_base(system_prompt_tokens=40000), r"sources\[0\]: max_context_tokens \(32768\) must exceed"),
        (_base(curve="night"), r"sources\[0\]\.curve 'night' is not defined under curves"),
        (_base(curve={"hourly": [1, 2]}), r"sources\[0\]\.curve: hourly must be a list of 24 numbers"),
        (_base(announce_steps="yes"), r"sources\[0\]\.announce_steps must be true or false"),
        (_base(tenant="acme") | {"tenants": {"free": {}}}, r"sources\[0\]\.tenant 'acme' is not listed in tenants"),
        (_base() | {"tenants": {"acme": {"priority": "urgent"}}}, r"tenants\.acme\.priority: unknown priority class"),
        (_base(kind="agent"), r"sources\[0\]\.task_tokens is required for kind agent"),
        (_base(end_s=5, start_s=10), r"sources\[0\]\.end_s \(5.0\) is before start_s"),
        ({"model": "m", "sources": [{"kind": "trace"}]}, r"sources\[0\]\.path is required"),
        ({"model": "m", "sources": [{"kind": "trace", "path": "/nonexistent.csv"}]}, r"sources\[0\]\.path: cannot read"),
        ({"model": "m", "sources": [{"kind": "trace", "path": "x", "tasks_per_s": 1}]}, r"unknown field\(s\) \['tasks_per_s'\]"),
        ({"model": "m", "sources": [_base()["sources"][0], _base()["sources"][0] | {"name": "copilot"}]},
         r"sources\[1\]\.name 'copilot' is already used"),
        ({"model": "m", "block_size": 0, "sources": [_base()["sources"][0]]}, r"block_size must be >= 1"),
    ],
)
def test_spec_validation_names_the_field(spec, message):
    with pytest.raises(WorkloadSpecError, match=message):
        parse_workload(spec, 0)


def test_trace_knob_validation(trace):
    for knob, value, message in [("speed", -1, r"speed must be > 0"), ("limit", -1, r"limit must be >= 1"), ("limit", 0, r"limit must be >= 1"),
                                 ("repeat", 0, r"repeat must be >= 1"), ("max_tokens", "lots", r"max_tokens must be an integer"),
                                 ("slo", {"batch": -1}, r"slo\.batch: weight must be a number >= 0"),
                                 ("format", "parquet", r"path: trace format must be")]:
        spec = {"model": "m", "sources": [{"kind": "trace", "path": trace, knob: value}]}
        with pytest.raises(WorkloadSpecError, match=rf"sources\[0\]\.{message}"):
            parse_workload(spec, 0)


def test_spec_file_errors(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("sources: [")
    with pytest.raises(WorkloadSpecError, match="invalid YAML"):
        load_workload(p)
    with pytest.raises(WorkloadSpecError, match="cannot read"):
        load_workload(tmp_path / "none.yaml")
    p.write_text(textwrap.dedent("""
        model: m
        sources:
          - {kind: copilot, tasks_per_s: 1, calls: [20, 10]}
    """))
    with pytest.raises(WorkloadSpecError, match=rf"{p.name}: sources\[0\]\.calls"):
        load_workload(p)


def test_same_spec_dict_same_seed_is_deterministic():
    spec = {"model": "m", "duration_s": 50, "sources": [{"kind": "chatbot", "tasks_per_s": 2},
                                                        {"kind": "copilot", "tasks_per_s": 0.5}]}
    runs = [[(a.time, *content(a)) for a in drive(parse_workload(spec, 1))[0]] for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) > 50
    assert math.isinf(parse_workload(spec, 1).next_time) is False


def test_the_documented_example_spec_loads(shared_dir):
    import yaml

    import steersman.twin.workload.spec as spec_mod

    doc = spec_mod.__doc__
    text = doc[doc.index("```yaml") + len("```yaml"):doc.index("```", doc.index("```yaml") + 7)]
    data = yaml.safe_load(text)
    root = pathlib.Path(__file__).resolve().parents[2]  # the example's trace path is relative to the project root
    w = parse_workload(data, 1, base_dir=root)
    assert [s.kind for s in w.sources] == ["copilot", "mooncake"]
    assert w.sources[0].params["max_tasks"] == 1000 and w.sources[1].params["speed"] == 2.0
    seen, _ = drive(w, until=200.0)
    assert {a.tenant for a in seen} == {"acme", "free"}
