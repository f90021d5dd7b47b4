"""Cascade drill: one replica degrades 5x while clients retry; the fleet does not collapse and recovers.

Engines run 10x faster than real time, so "recovers within 60 s after the fault
clears" is within 6 s here; see :func:`steersman.testing.drills.cascade`.
"""

from steersman.testing.drills import cascade

SPEEDUP = 10.0


def test_cascade_drill_one_replica_5x_slower_while_clients_retry():
    r = cascade(slowdown=5.0, load=0.7, speedup=SPEEDUP)
    summary = str(r)
    assert r.failed <= 0.01 * r.total, summary  # no collapse: (almost) every request is served
    assert r.goodput_during >= 0.8 * r.goodput_before, summary  # the offered load is still carried
    assert r.recovery_s <= 60.0 / SPEEDUP, summary
