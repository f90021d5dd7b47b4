"""Workflow headers, tracking and the protection value."""

import pytest

from steersman.config.admission import AdmissionSettings
from steersman.control.workflow import (
    WORKFLOW_ID_HEADER as ID, WORKFLOW_STEP_HEADER as STEP, WORKFLOW_STEPS_HEADER as STEPS,
    WorkflowHeaderError, WorkflowHeaders, WorkflowTracker, parse_workflow_headers, protection_value,
)


def test_protection_value_formula():
    assert protection_value(0.0, 7, 10) == 0.0  # nothing sunk, nothing to protect
    assert protection_value(2.0, 1, 10) == 2.0  # first step: progress 0
    assert protection_value(2.0, 6, 10) == pytest.approx(2.0 * 1.5)
    assert protection_value(2.0, 10, 10) == pytest.approx(2.0 * 1.9)
    assert protection_value(2.0, 5, None) == 2.0  # n unknown
    assert protection_value(2.0, 30, 10) == 4.0  # progress clamped to 1


def test_headers_parse():
    assert parse_workflow_headers({}) is None
    assert parse_workflow_headers({ID: "wf-1"}) == WorkflowHeaders("wf-1", None, None)
    assert parse_workflow_headers({ID: " wf-1 ", STEP: "3", STEPS: " 5"}) == WorkflowHeaders("wf-1", 3, 5)


@pytest.mark.parametrize(
    "headers, header, message",
    [
        ({ID: "w", STEP: "0"}, STEP, "must be an integer from 1 to 999999999"),
        ({ID: "w", STEP: "-1"}, STEP, "must be an integer from 1 to 999999999"),
        ({ID: "w", STEP: "two"}, STEP, "must be an integer from 1 to 999999999"),
        ({ID: "w", STEP: "1.5"}, STEP, "must be an integer from 1 to 999999999"),
        ({ID: "w", STEPS: "0"}, STEPS, "must be an integer from 1 to 999999999"),
        ({ID: "w", STEP: "²"}, STEP, "must be an integer from 1 to 999999999"),
        ({ID: "w", STEP: "4", STEPS: "3"}, STEP, r"\(4\) must be <= x-steersman-workflow-steps \(3\)"),
        ({STEP: "1"}, STEP, "needs x-steersman-workflow-id"),
        ({STEPS: "4"}, STEPS, "needs x-steersman-workflow-id"),
        ({ID: ""}, ID, "1 to 256 printable"),
        ({ID: "x" * 257}, ID, "1 to 256 printable"),
        ({ID: "a\x00b"}, ID, "printable"),
    ],
)
def test_bad_headers_name_the_header(headers, header, message):
    with pytest.raises(WorkflowHeaderError, match=message) as e:
        parse_workflow_headers(headers)
    assert e.value.header == header and header in str(e.value)


def test_tracking_accumulates_sunk_cost_and_values_late_steps():
    wt = WorkflowTracker()
    first = wt.track("acme", WorkflowHeaders("wf", 1, 4), now=10.0)
    assert (first.calls, first.tokens, first.spent_usd, first.started, first.value) == (0, 0, 0.0, 10.0, 0.0)
    wt.record("acme", "wf", tokens=1000, cost_usd=0.5, now=12.0)
    wt.record("acme", "wf", tokens=500, cost_usd=0.25, now=13.0)
    v = wt.track("acme", WorkflowHeaders("wf", 3, None), now=14.0)  # n remembered from the first call
    assert (v.step, v.steps, v.calls, v.tokens, v.started) == (3, 4, 2, 1500, 10.0)
    assert v.spent_usd == pytest.approx(0.75) and v.value == pytest.approx(0.75 * 1.5)


def test_step_is_inferred_from_calls_when_absent():
    wt = WorkflowTracker()
    wt.track("t", WorkflowHeaders("wf", None, 3), 0.0)
    wt.record("t", "wf", tokens=1, cost_usd=1.0, now=0.0)
    v = wt.track("t", WorkflowHeaders("wf", None, None), 1.0)
    assert v.step == 2 and v.value == pytest.approx(1.0 * (1 + 1 / 3))


def test_new_workflows_first_step_is_below_an_inflight_late_step():
    wt = WorkflowTracker()
    wt.track("t", WorkflowHeaders("old", 1, 5), 0.0)
    for _ in range(4):
        wt.record("t", "old", tokens=100, cost_usd=0.01, now=1.0)
    late = wt.track("t", WorkflowHeaders("old", 5, 5), 2.0)
    new = wt.track("t", WorkflowHeaders("new", 1, 5), 2.0)
    assert new.value == 0.0 < late.value


def test_workflows_are_scoped_per_tenant():
    wt = WorkflowTracker()
    wt.track("a", WorkflowHeaders("wf", None, None), 0.0)
    wt.record("a", "wf", tokens=10, cost_usd=5.0, now=0.0)
    assert wt.track("b", WorkflowHeaders("wf", None, None), 0.0).spent_usd == 0.0


def test_memory_is_bounded_least_recently_used_first():
    wt = WorkflowTracker(AdmissionSettings(workflow_max_entries=3))
    for i in range(3):
        wt.track("t", WorkflowHeaders(f"w{i}", None, None), float(i))
        wt.record("t", f"w{i}", tokens=1, cost_usd=1.0, now=float(i))
    wt.track("t", WorkflowHeaders("w0", None, None), 5.0)  # w0 is now most recent
    wt.track("t", WorkflowHeaders("w3", None, None), 6.0)  # evicts w1
    assert len(wt) == 3
    assert wt.track("t", WorkflowHeaders("w0", None, None), 7.0).calls == 1
    assert wt.track("t", WorkflowHeaders("w1", None, None), 7.0).calls == 0  # forgotten


def test_idle_workflows_expire_after_the_ttl():
    wt = WorkflowTracker(AdmissionSettings(workflow_idle_ttl_s=100.0))
    wt.track("t", WorkflowHeaders("a", None, None), 0.0)
    wt.record("t", "a", tokens=1, cost_usd=1.0, now=50.0)
    assert wt.track("t", WorkflowHeaders("a", None, None), 149.0).calls == 1  # 99 s idle: kept
    wt.track("t", WorkflowHeaders("b", None, None), 300.0)  # any call sweeps idle ones
    assert len(wt) == 1
    v = wt.track("t", WorkflowHeaders("a", None, None), 300.0)
    assert (v.calls, v.started) == (0, 300.0)


def test_record_after_eviction_starts_over_and_bad_usage_is_rejected():
    wt = WorkflowTracker()
    wt.record("t", "gone", tokens=5, cost_usd=0.1, now=1.0)
    assert wt.track("t", WorkflowHeaders("gone", None, None), 1.0).calls == 1
    with pytest.raises(ValueError, match="tokens"):
        wt.record("t", "gone", tokens=-1, cost_usd=0.0, now=1.0)
    with pytest.raises(ValueError, match="cost_usd"):
        wt.record("t", "gone", tokens=1, cost_usd=float("nan"), now=1.0)


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="workflow_max_entries"):
        WorkflowTracker(AdmissionSettings(workflow_max_entries=0))


def test_peek_reads_a_view_without_making_or_refreshing_an_entry():
    """What the gateway's describe stage reads before admission: a request its limits refuse must not put its
    workflow in the shared LRU (evicting another tenant's) nor keep an idle one alive."""
    t = WorkflowTracker(AdmissionSettings(workflow_max_entries=2, workflow_idle_ttl_s=100.0))
    t.record("a", "w", tokens=10, cost_usd=1.0, now=0.0)
    t.admitted("a", "x", 4, 1.0)
    for i in range(5):
        v = t.peek("spam", WorkflowHeaders(f"junk-{i}", 2, 3), 2.0)
        assert (v.calls, v.spent_usd, v.value, v.steps, v.started, v.missed) == (0, 0.0, 0.0, 3, 2.0, False)
    assert len(t) == 2 and ("a", "w") in t._states
    v = t.peek("a", WorkflowHeaders("w", None, 5), 50.0)
    assert (v.step, v.steps, v.calls, v.spent_usd, v.started) == (2, 5, 1, 1.0, 0.0)
    assert t._states[("a", "w")].steps is None and t._states[("a", "w")].last_seen == 0.0  # unchanged
    assert t.peek("a", WorkflowHeaders("x", None, None), 2.0).steps == 4  # remembered at admission
    assert t.peek("a", WorkflowHeaders("w", None, None), 100.0).calls == 0  # idle past its TTL: a new task
    t.admitted("b", "y", None, 60.0)  # admitted: made, the least recently used goes
    assert list(t._states) == [("a", "x"), ("b", "y")]
