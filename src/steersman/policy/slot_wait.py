"""Waiting for a llama.cpp slot that will hold the request's prompt ("delay work" to avoid work).

llama.cpp reuses a prompt only from a free slot (:mod:`steersman.fleet.slots`).  When requests with
one uncached prompt arrive together, every router sends them at once and each engine computes the prompt
once per request; a request can instead wait for the running request that computes it there to end, and
then reuse its slot.  :func:`wait_for_slot` compares, for one request, the best predicted time to its first
token now with the best one after waiting (the running request's predicted end, then the prefill of what
its slot will not hold), and asks it to wait in the gateway queue when waiting is predicted to be at least
``1 - slot_wait_gain`` sooner (:class:`~steersman.config.SchedulerSettings`).  A running request already
past its predicted end is predicted to end after another ``slot_wait_overrun`` x the time it has overrun, so
the wait for a copy that runs late (a slow or stalled engine) is weighed again at every pass and ends once
another replica is predicted sooner; a fixed cut-off (give up at 50% past the predicted end) used to send
the waiters of a fleet that ran uniformly slower than its calibration to compute more copies of the prompt,
while the prediction for going now (at least the replicas' stall: :mod:`steersman.policy.predict`) was
the slower one by far.  Each running copy frees one
slot: a request with ``slot_waiters_ahead`` = k others waiting for the same prompt ahead of it in the queue
counts on the (k+1)-th soonest copy, and on none when there are no more copies than waiters (the control
plane counts them as it walks the queue).  The queue re-decides it at
every request end and scrape: once the slot frees, the prefix index (answered by the slot mirror) credits
the replica, and the request goes there.  Pure; the replicas it waits for are unprofiled ones (their
prediction is the engine's own timing: :func:`~steersman.policy.predict.unprofiled_speeds`).
"""

from __future__ import annotations

import math

import numpy as np

from steersman.policy.base import Queue
from steersman.policy.predict import unprofiled_speeds

__all__ = ["wait_for_slot"]


def wait_for_slot(snap, req, idx: np.ndarray, ttft: np.ndarray, held: np.ndarray, protected: bool,
                  target_ttft: float, gain: float, overrun: float, settings=None) -> Queue | None:
    """``idx``: the candidates; ``ttft``: their predicted TTFT now; ``held``: blocks of the prompt each
    replica (all of them) would reuse now; ``settings``: the prediction's (its unprofiled priors; None: the
    defaults).  A :class:`Queue` when the request should wait for a slot."""
    prefix = snap.prefix
    hashes = req.block_hashes
    if prefix is None or not prefix.slots or protected or req.resumed or not hashes or not ttft.size:
        return None
    now = snap.time
    bs = snap.statics.block_size
    pt = req.prompt_tokens
    ways: list[tuple[float, int]] = []  # (predicted TTFT waiting for that running copy, its replica)
    for j in range(idx.size):
        i = int(idx[j])
        mirror = prefix.slots.get(i)
        if mirror is None or snap.statics.modelled[i]:
            continue
        running = mirror.in_flight(hashes)
        if not running:
            continue
        have = min(int(held[i]) * bs, max(pt - 1, 0)) if held.size else 0
        s_tok, step, r_ttft = (float(x[0]) for x in unprofiled_speeds(snap, np.array([i]), settings))
        for f in running:
            gained = min(f.blocks * bs, max(pt - 1, 0)) - have
            if gained <= 0:
                continue
            late = now - f.due  # past its predicted end: predicted to run late by another ``overrun`` x as long
            left = overrun * late if late > 0.0 else -late
            ways.append((left + (step + (pt - have - gained) * s_tok) * r_ttft, i))
    k = req.slot_waiters_ahead  # each running copy frees one slot: the requests waiting ahead take the first k
    if k >= len(ways):
        return None
    best, where = sorted(ways)[k]
    now_best = float(ttft.min())
    if not best < gain * now_best:
        return None
    if target_ttft < math.inf:
        left = target_ttft - (now - req.arrival)
        if best > left and now_best <= left:  # waiting would miss a TTFT target that going now meets
            return None
    return Queue(f"waits for a slot of {snap.names[where]} that will hold its prompt: first token predicted in "
                 f"{best:.2f} s that way, {now_best:.2f} s at best now (scheduler.slot_wait)", keeps_place=True)
