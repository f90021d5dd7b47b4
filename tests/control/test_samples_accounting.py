"""A request of ``n`` samples: the engine decodes each as a sequence of its own, side by side, so what the
fleet learns from it (the replica's TPOT, the tenant's output length) is one sample's, while its tokens and
cost count all of them."""

from __future__ import annotations

import math
from dataclasses import replace

from tests.control.test_retry_accounting import _advance, _go, _setup

from steersman.fleet import snapshot as S


def _serve(samples: int, tokens: int):
    clock, fleet, acc, plane, flows, req, admit = _setup()
    req = replace(req, samples=samples, workflow=None)
    started = _go(acc, req, admit, 0)
    _advance(clock, 0.1)
    fleet.first_token(started.ticket)
    _advance(clock, 0.9)  # 0.9 s of decoding after the first token
    acc.ended(started, tokens, True)
    return fleet, acc


def test_three_samples_of_ten_tokens_teach_what_one_sample_of_ten_does():
    one_fleet, one = _serve(1, 10)
    three_fleet, three = _serve(3, 30)
    tpot = three_fleet.live[S.TPOT_EWMA, 0]
    assert math.isclose(tpot, one_fleet.live[S.TPOT_EWMA, 0]) and math.isclose(tpot, 0.9 / 9)  # not 0.9 / 29
    assert three.outputs.mean("m", "t") == one.outputs.mean("m", "t")
    assert three_fleet.live[S.IN_FLIGHT, 0] == 0


# ---- found by review (twenty-seventh session); each failed before its fix ----------------------------------------
def test_a_whole_response_teaches_no_tpot():
    # its "first token" is the whole answer's arrival: (end - first) / tokens was ~0 s a token, fed to the TPOT
    # average, the learnt correction of every prediction and the outlier detector's peer median
    clock, fleet, acc, plane, flows, req, admit = _setup()
    before = fleet.live[S.TPOT_EWMA, 0]
    started = _go(acc, replace(req, stream=False, workflow=None), admit, 0)
    _advance(clock, 0.8)
    fleet.first_token(started.ticket)  # (Forward._whole, once the body is in)
    acc.ended(started, 8, True)
    assert fleet.live[S.TPOT_EWMA, 0] == before or math.isnan(before) and math.isnan(fleet.live[S.TPOT_EWMA, 0])


def test_a_continued_stream_teaches_its_last_replica_the_tokens_it_made():
    clock, fleet, acc, plane, flows, req, admit = _setup()
    started = _go(acc, replace(req, workflow=None), admit, 1)  # the continuation's leg there
    _advance(clock, 0.1)
    fleet.first_token(started.ticket)
    _advance(clock, 2.0)  # 6 tokens 0.4 s apart after its first (5 more came from the replica that died)
    acc.ended(started, 11, True, leg_tokens=6)
    assert math.isclose(fleet.live[S.TPOT_EWMA, 1], 2.0 / 5)  # was 2.0 / 10

