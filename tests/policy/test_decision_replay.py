"""Every profile decides exactly as the code before the compiled/fused decision path did.

20,880 recorded decisions (``data/decisions.txt.gz``, from ``replayscenarios.py --record`` at commit
5065ab4; re-recorded when the steersman profile's picker, saturation rule or shortlist changed, see ``replayscenarios``): 9 profiles x 2,320 (snapshot, request) cases, random fleets of 1-1,000 replicas and the
bench's loaded 1,000-replica fleet.  A decision matches when its kind, replica, reason, Retry-After
and predicted TTFT/TPOT (every bit, by ``repr``) are the same.
"""

from __future__ import annotations

import gzip

from replayscenarios import DATA, decisions


def test_decisions_match_the_recorded_ones():
    with gzip.open(DATA, "rt") as f:
        recorded = f.read().splitlines()
    now = decisions()
    assert len(now) == len(recorded) == 20880
    diff = [(a, b) for a, b in zip(recorded, now) if a != b]
    assert not diff, f"{len(diff)} decisions changed, e.g. recorded {diff[0][0]!r} now {diff[0][1]!r}"
