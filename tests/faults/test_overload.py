"""Overload at 3x the fleet's capacity (measured first, same fleet, same run): the gateway sheds, it does not amplify.

Clients retry 429/503 after ``Retry-After``.  Engines run 4 sequences at once at
real speed (speedup 1: the request rates stay within what this machine's Python
load generator can offer); see :func:`steersman.testing.drills.overload`.
"""

from steersman.testing.drills import overload


def test_overload_at_3x_capacity():
    # engines at half real speed (SLO targets scaled to match): half the request rate, so the in-process
    # load generator and engines leave the gateway its CPU on a busy 2-core machine
    r = overload(factor=3.0, seconds=8.0, speedup=0.5)  # bounded queue (64): the excess is shed with 503 + Retry-After
    summary = (f"capacity {r.capacity_rps:.1f}/s offered {r.offered_rps:.1f}/s goodput {r.goodput_rps:.1f}/s; "
               f"attempts {r.upstream_attempts} http {r.http_requests} requests {r.client_requests}; "
               f"critical {r.critical_in_slo}/{r.critical_total}; status {r.status_counts}; queue max {r.queue_high_water}")
    assert r.amplification <= 1.1, summary  # upstream attempts / client HTTP requests
    assert r.attempts_per_request <= 1.1, summary  # upstream attempts / unique client requests
    assert r.goodput_ratio >= 0.9, summary
    assert r.critical_attainment >= 0.99, summary
    assert r.retry_after_missing == 0, summary  # every 429 / 503 says when to come back
    assert r.status_counts.get(0, 0) == 0 and r.left_at_end == (0, 0), summary  # nothing hung, nothing leaked
    # it shed (clients came back after Retry-After) and the queue stayed bounded
    assert r.http_requests > r.client_requests and r.queue_high_water <= 64, summary
