"""A task still under way when the run stops (``duration_s``) is unfinished, not a success."""

import pytest

from steersman.fleet.config import parse_fleet
from steersman.policy import make_policy
from steersman.twin import Twin, TwinConfig, TwinFleet, summarize
from steersman.twin.workload import AgentSource
from steersman.twin.workload.apps import preset

FLEET = parse_fleet({"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "count": 1, "pool": "h"}]}})


def _run(duration_s=None, drain=True, calls=3):
    """One task of ``calls`` short calls 10 s apart."""
    app = preset("copilot", calls=calls, gap_s=10.0, task_tokens=100, output_tokens=50, tool_tokens=20)
    tf = TwinFleet.from_config(FLEET)
    w = AgentSource(app, model="llama-3.1-8b", tasks_per_s=1.0, max_tasks=1, seed=3)
    cfg = TwinConfig(duration_s=duration_s, drain=drain)
    rec = Twin(tf, w, make_policy("round-robin", tf.scheduler), cfg=cfg).run()
    return summarize(rec), rec.arrays()


def test_a_task_whose_later_calls_came_after_the_stop_did_not_succeed():
    whole, c = _run()
    assert (whole["tasks"], whole["tasks_succeeded"]) == (1, 1)
    cut, c = _run(duration_s=float(c["finish"][0]) + 5.0)  # call 1 done and on time, call 2 due after the stop
    assert c["status"].size == 1
    assert cut["tasks_succeeded"] == 0 and cut["task_success_rate"] == 0.0
    assert (cut["tasks"], cut["tasks_succeeded"], cut["tasks_unfinished"]) == (1, 0, 1)
    assert cut["cost_per_successful_task_usd"] is None and whole["tasks_unfinished"] == 0


def test_a_call_left_in_flight_without_drain_leaves_its_task_unfinished():
    whole, c = _run(calls=1)
    assert whole["tasks_succeeded"] == 1
    cut, _ = _run(duration_s=float(c["first"][0] + c["finish"][0]) / 2, drain=False, calls=1)  # mid-decode
    assert (cut["tasks"], cut["tasks_succeeded"], cut["tasks_unfinished"]) == (1, 0, 1)
