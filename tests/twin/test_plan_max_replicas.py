"""`plan`'s single-type search tries the counts up to ``max_replicas``, not only up to the last power of two."""

from steersman.twin.plan import plan_capacity

SPEC = {"model": "llama-3.1-8b", "sources": [{"kind": "chatbot", "tasks_per_s": 1}]}


def _needs(n):
    """A capacity model: the SLO is met from ``n`` replicas on (attainment keeps rising below: no plateau)."""
    def trial(fleet):
        k = sum(c for _, c in fleet)
        ok = k >= n
        return {"slo_attainment": 1.0 if ok else 0.5 + 0.04 * k, "requests": 1000, "refused": 0,
                "failed": 0 if ok else 500, "cost_per_successful_task_usd": 0.01}
    return trial


def test_a_count_between_the_last_power_of_two_and_max_replicas_is_found():
    tried = []
    p = plan_capacity(SPEC, ["H100"], max_replicas=12, trial=_needs(10), progress=tried.append)
    assert [o.fleet for o in p.options] == [(("H100-SXM", 10),)] and not p.infeasible
    assert any(t.startswith("12 x ") for t in tried)


def test_infeasible_only_after_max_replicas_itself_fell_short():
    tried = []
    p = plan_capacity(SPEC, ["H100"], max_replicas=12, trial=_needs(13), progress=tried.append)
    assert not p.options and p.infeasible == {"H100-SXM": "not enough with 12 replicas"}
    assert tried[-1].startswith("12 x ")
