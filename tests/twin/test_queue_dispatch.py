"""The twin drains its gateway queue as the live gateway does (api/lifecycle.py): one decision at a time, each
dispatch's accounting in the next decision's snapshot.  It used to route up to 64 queued requests on one state
and account them afterwards, so a drained burst all went to the replica that was best when the drain began."""

from dataclasses import replace

from steersman.config import DEFAULTS
from steersman.fleet import snapshot as S
from steersman.policy import Route, make_policy
from steersman.twin import ReplicaPlan, Twin, TwinConfig, TwinFleet, summarize

from tests.twin.test_core_smoke import A
from steersman.testing import ReplayWorkload


class Recording:
    """The steersman profile, noting what each routed decision saw: (time, requests in flight fleet-wide)."""

    def __init__(self, settings) -> None:
        self.inner = make_policy("steersman", settings)
        self.name = self.inner.name
        self.seen: list[tuple[float, float]] = []

    def pick(self, snap, req):
        d = self.inner.pick(snap, req)
        if isinstance(d, Route):
            self.seen.append((snap.time, float(snap.live[S.IN_FLIGHT].sum())))
        return d


def test_queued_requests_are_routed_one_at_a_time_on_the_state_their_predecessors_left():
    settings = replace(DEFAULTS.scheduler, saturation_queue_depth=1)
    fleet = TwinFleet([ReplicaPlan(f"h{i}", "H100", "llama-3.1-8b") for i in range(3)], scheduler=settings)
    # bursts of 40 simultaneous arrivals, every 2 s: most of each burst waits in the gateway queue
    burst = [A(2.0 * (i // 40), i, prompt_tokens=3000, output_tokens=50, max_tokens=50) for i in range(160)]
    policy = Recording(settings)
    twin = Twin(fleet, ReplayWorkload(burst), policy, cfg=TwinConfig())
    s = summarize(twin.run())
    assert s["completed"] == 160
    queued = s["requests"] - sum(1 for t, _ in policy.seen if t in (0.0, 2.0, 4.0, 6.0))  # routed later: queued
    assert queued > 40, "the bursts must queue for this test to mean anything"
    # every routed decision sees the one before it in flight (nothing ends between two decisions at one instant)
    same = [(a, b) for a, b in zip(policy.seen, policy.seen[1:]) if a[0] == b[0]]
    assert same and all(b[1] >= a[1] + 1 for a, b in same), [(a, b) for a, b in same if b[1] < a[1] + 1][:5]


def test_requests_held_for_a_prefill_to_drain_go_when_one_does():
    """Late work held in the gateway (``scheduler.hold_late``) waits for the prefill queued ahead of it to drain: a
    first token (a prefill done) wakes the queue, not only a request's end or the 50 ms expiry tick."""
    fleet = TwinFleet([ReplicaPlan(f"h{i}", "H100", "llama-3.1-8b") for i in range(3)])
    # a burst of long prompts with long answers: prefills end long before any request does
    burst = [A(0.0, i, prompt_tokens=6000, output_tokens=400, max_tokens=400) for i in range(90)]
    rec = Twin(fleet, ReplayWorkload(burst), make_policy("steersman"), cfg=TwinConfig()).run()
    c = rec.arrays()
    held = c["dispatch"][c["dispatch"] > c["arrival"]].tolist()
    assert len(held) > 20, "the burst must be held back for this test to mean anything"
    firsts, finishes = set(c["first"].tolist()), set(c["finish"].tolist())
    at_prefill = [t for t in held if t in firsts and t not in finishes]
    assert len(at_prefill) > len(held) / 2, (len(at_prefill), len(held))
