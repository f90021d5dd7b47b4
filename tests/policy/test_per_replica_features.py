"""Per-replica features stay indexed by replica when filters narrow the candidates.

Regression: ``prefix_held`` (the index's match for every replica) was re-sliced to
the candidates after the shortlist narrowed them, so ``prefix_blocks`` read it by
replica index out of bounds (garbage, allocation-dependent decisions).
"""

import numpy as np

from steersman.policy import make_policy
from steersman.policy.framework import DecisionContext
from steersman.testing.snapshots import chain, fleet_snapshot, prefix_index, sched_request


def test_prefix_held_survives_the_shortlist_at_fleet_scale():
    n = 80  # more than the shortlist's 32: it narrows the candidates
    hashes = chain("sys", 120)
    holder = n - 1  # the highest index: out of range of any candidate-aligned slice
    snap = fleet_snapshot(n, prefix=prefix_index(n, {holder: hashes}), in_flight=[3.0] * (n - 1) + [5.0])
    req = sched_request(prompt_tokens=120 * 16, hashes=hashes)
    ctx = DecisionContext(snap, req, snap.candidates(req.model))
    held = ctx.feature("prefix_held")
    ctx.narrow(np.arange(n) % 3 == 2)  # holder (79 % 3 == 1) is out ...
    ctx.narrow(np.ones(ctx.candidates.size, dtype=bool))
    assert ctx.feature("prefix_held") is held and held.size == n
    ctx2 = DecisionContext(snap, req, snap.candidates(req.model))
    ctx2.feature("prefix_held")
    ctx2.narrow(np.isin(np.arange(n), [0, 5, holder]))
    blocks = ctx2.feature("prefix_blocks")
    assert blocks.tolist() == [0.0, 0.0, 119.0]  # of a block-aligned prompt the engine computes the last block again
    d = make_policy("steersman").pick(snap, req)
    assert d.replica == holder
    for _ in range(3):  # the same decision every time (no reads past an array's end)
        assert make_policy("steersman").pick(snap, req) == d
