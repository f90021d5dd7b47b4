"""A replica killed in the middle of a step: the steps that ended by then stand, the one in progress is lost.

Its requests are then lost (failed, or retried / continued with the reliability mechanisms on) -- never left
neither finished nor failed -- the tokens counted as sent are those of the steps that ended (a first token
still in the step in progress was never seen: the retry's first token is the TTFT), and the busy time until the
death is recorded.
"""

import math

import pytest

from steersman.config import ReliabilitySettings
from steersman.fleet.config import parse_fleet
from steersman.policy import make_policy
from steersman.testing import ReplayWorkload, arrival
from steersman.twin import Twin, TwinConfig, TwinFleet
from steersman.twin.results import FAILED, OK


def _fleet(count):
    return parse_fleet({"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "count": count,
                                                    "pool": "h"}]}})


def _req(t, seq, out=20):
    return arrival(t, seq, prompt_tokens=500, output_tokens=out, max_tokens=None)


def _run(items, count=2, kill=None, reliability=False):
    """One small run (``duration_s`` bounds it: a request left in flight would keep the workload going);
    ``kill``: (time, replica)."""
    tf = TwinFleet.from_config(_fleet(count))
    tw = Twin(tf, ReplayWorkload(items), make_policy("round-robin", tf.scheduler),
              cfg=TwinConfig(duration_s=30.0, reliability=ReliabilitySettings() if reliability else None))
    if kill is not None:
        at, i = kill
        tw.schedule_drill(at, lambda tw: tw.kill(i))
    rec = tw.run()
    return rec.arrays(), rec


@pytest.fixture(scope="module")
def alone():
    """One request alone on the fleet: where it ran, its first token, its end."""
    c, _ = _run([_req(0.0, 0)])
    assert c["status"][0] == OK and c["output"][0] == 20
    return int(c["replica"][0]), float(c["dispatch"][0]), float(c["first"][0]), float(c["finish"][0])


def test_a_kill_in_the_finishing_step_of_a_decode_run_loses_the_request(alone):
    rep, _, _, fin = alone
    c, _ = _run([_req(0.0, 0)], kill=(fin - 0.001, rep))  # the last decode step has not ended
    assert c["status"][0] == FAILED and c["finish"][0] == pytest.approx(fin - 0.001)


def test_a_kill_in_the_finishing_step_continues_the_stream_without_its_last_token(alone):
    rep, _, first, fin = alone
    c, _ = _run([_req(0.0, 0)], kill=(fin - 0.001, rep), reliability=True)
    assert c["status"][0] == OK and c["replica"][0] != rep
    assert c["output"][0] == 20 and c["first"][0] == first and c["finish"][0] > fin  # the client's TTFT stands


def test_a_kill_after_an_arrival_cut_the_finishing_step_loses_both():
    """A request arriving during the finishing step cuts the run there (the step's finishes are applied, the
    replica wakes at its end); a kill before that end loses the finisher too."""
    c, _ = _run([_req(0.0, 0)], count=1)
    fin = float(c["finish"][0])
    c, rec = _run([_req(0.0, 0), _req(fin - 0.004, 1)], count=1, kill=(fin - 0.001, 0))
    assert c["status"].tolist() == [FAILED, FAILED]
    assert rec.busy[0] == pytest.approx(fin - 0.001 - c["dispatch"][0] - TwinConfig().gateway_latency_s)


def test_a_kill_during_the_first_token_step_retries_and_the_ttft_is_the_retry_s(alone):
    rep, dispatch, first, _ = alone
    at = (dispatch + first) / 2  # the prefill step that makes the first token is under way
    c, _ = _run([_req(0.0, 0)], kill=(at, rep), reliability=True)
    assert c["status"][0] == OK and c["replica"][0] != rep and c["output"][0] == 20
    assert not math.isnan(c["first"][0]) and c["first"][0] > at


def test_a_kill_records_the_busy_time_until_the_death(alone):
    rep, dispatch, _, fin = alone
    at = (dispatch + fin) / 2  # decoding
    _, rec = _run([_req(0.0, 0)], kill=(at, rep))
    assert rec.busy[rep] == pytest.approx(at - dispatch - TwinConfig().gateway_latency_s)
    assert rec.busy[1 - rep] == 0.0


def test_after_a_cut_the_finisher_continues_without_its_last_token(alone):
    rep, _, first, fin = alone  # round-robin: the second request goes to the other replica, the third joins the first
    items = [_req(0.0, 0), _req(0.0001, 1, out=2), _req(fin - 0.004, 2)]
    c, _ = _run(items, kill=(fin - 0.001, rep), reliability=True)
    assert c["replica"][2] != rep  # the third was retried elsewhere too
    assert c["status"].tolist() == [OK, OK, OK] and c["output"].tolist() == [20, 2, 20]
    assert c["first"][0] == first and c["finish"][0] > fin
