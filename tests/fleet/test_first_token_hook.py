"""A first token is a prefill done: the fleet tells its owner (the gateway wakes the requests it holds back until the
prefill queued ahead of them drains, ``scheduler.hold_late``), once per request."""

from steersman.fleet import snapshot as S
from steersman.fleet.state import Fleet, Replica
from steersman.testing.clock import FakeClock


def test_each_request_s_first_token_calls_the_hook_once():
    f = Fleet([Replica(0, "r0", "http://127.0.0.1:9000", "engine-sim", "H100", ("m",), "p", 2.0, 1, adapter=None)],
              FakeClock(start=1.0))
    calls = []
    # what the woken queue's next decision sees: the prefill done no longer pending there
    f.on_first_token = lambda: calls.append(float(f.snapshot().live[S.PENDING_PREFILL, 0]))
    a = f.begin(0, 1_000)
    f.first_token(a)
    f.first_token(a)  # a duplicate report of the same first token
    whole = f.begin(0, 500, streamed=False)  # a whole (non-streamed) response: its prefill is done when it comes
    f.first_token(whole)
    assert calls == [0.0, 0.0]
    f.on_first_token = None  # no owner: nothing to call
    f.first_token(f.begin(0, 10))
    assert len(calls) == 2
