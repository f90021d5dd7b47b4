"""results.json's prediction keys: how often the scheduler found no replica to meet a request's SLO, and how
its predictions came out (the live gateway counts the same as steersman:routes_total)."""

from steersman.fleet.config import parse_fleet
from steersman.twin.run import Experiment

FLEET = parse_fleet({"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "count": 2}]}}, "test")
SPEC = {"model": "llama-3.1-8b", "duration_s": 60.0,
        "sources": [{"kind": "chatbot", "slo": "interactive", "tasks_per_s": 4.0, "system_prompt_tokens": 600}]}


def _run(policy: str, load: float) -> dict:
    return Experiment(FLEET, SPEC, None, 0).run(policy, load)


def test_predictions_come_out_as_predicted_and_overload_shows_as_predicted_misses():
    light, heavy = _run("steersman", 1.0), _run("steersman", 12.0)
    assert light["predicted_missed_share"] == 0.0 and light["slo_attainment_predicted_met"] > 0.99
    assert light["slo_attainment_predicted_missed"] is None
    # overloaded: a share of the routes found no replica predicted in time, and those met their SLO far less often
    assert 0.05 < heavy["predicted_missed_share"] < 1.0, heavy["predicted_missed_share"]
    assert heavy["slo_attainment_predicted_met"] > heavy["slo_attainment_predicted_missed"] + 0.3, heavy
    assert heavy["slo_attainment_predicted_met"] > 0.9


def test_a_profile_that_does_not_predict_reports_none():
    s = _run("round-robin", 12.0)
    assert s["predicted_missed_share"] is None and s["slo_attainment_predicted_met"] is None
    assert s["slo_attainment_predicted_missed"] is None
