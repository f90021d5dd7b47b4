"""The prefix index learns a prompt at dispatch on engines that share a prompt still prefilling (vLLM, SGLang,
engine-sim) and when its request ends on those that reuse it only from a free slot that ran it (llama.cpp)."""

from __future__ import annotations

from steersman.config import DEFAULTS
from steersman.control.accounting import Accounting
from steersman.control.plane import Dispatch
from steersman.engines.llamacpp import LlamaCppAdapter
from steersman.engines.openai_http import OpenAIHttpAdapter
from steersman.fleet.prefix_index import PrefixIndex
from steersman.fleet.state import Fleet, Replica
from steersman.policy.base import Route
from steersman.policy.request import PriorityClass, SchedRequest
from steersman.testing.clock import FakeClock

HASHES = tuple(range(1000, 1040))


def _setup():
    adapters = [OpenAIHttpAdapter("vllm"), LlamaCppAdapter()]
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", a.kind, None, ("m",), "p", 1.0, 1, adapter=a)
            for i, a in enumerate(adapters)]
    fleet = Fleet(reps, FakeClock(start=5.0))
    fleet.prefix = PrefixIndex(2, 8 * 2**20)
    acc = Accounting(fleet, None, None, DEFAULTS.scheduler, 16)  # dispatch bookkeeping needs only the fleet
    return fleet, acc


def _dispatch(acc: Accounting, replica: int, seq: int):
    req = SchedRequest(seq=seq, model="m", kind="chat", stream=True, tenant="t", priority=PriorityClass.STANDARD,
                       arrival=5.0, prompt_tokens=16 * len(HASHES) + 3, block_hashes=HASHES, max_tokens=8,
                       expected_output=8)
    return acc.dispatched(req, Dispatch(Route(replica, "test"), None))


def test_a_sharing_engine_is_credited_at_dispatch():
    fleet, acc = _setup()
    _dispatch(acc, 0, 1)
    assert fleet.prefix.match(HASHES).tolist() == [40, 0]


def test_a_slot_cache_engine_is_credited_only_once_the_prompt_ran_and_its_request_ended():
    fleet, acc = _setup()
    s = _dispatch(acc, 1, 1)
    assert fleet.prefix.match(HASHES).tolist() == [0, 0]  # a follower now would prefill it again there
    follower = _dispatch(acc, 1, 2)
    assert follower.predicted_hit_blocks == 0
    acc.first_token(s)
    # still not: llama-server reuses a prompt only from a free slot (tests/real/test_llamacpp_slot_reuse.py)
    assert fleet.prefix.match(HASHES).tolist() == [0, 0]
    fleet.report(s.ticket, True)
    fleet.end(s.ticket, 8)
    assert fleet.prefix.match(HASHES).tolist() == [0, 40]
    assert fleet.prefix.blocks_per_replica().tolist() == [0, 40]


def test_a_prompt_that_ran_is_credited_even_if_its_client_left_mid_stream():
    fleet, acc = _setup()
    s = _dispatch(acc, 1, 1)
    acc.first_token(s)
    fleet.end(s.ticket, 3)  # no verdict: the client went away; the slot still holds the prompt it ran
    assert fleet.prefix.match(HASHES).tolist() == [0, 40]


def test_a_prompt_that_never_ran_is_never_credited():
    fleet, acc = _setup()
    s = _dispatch(acc, 1, 1)
    fleet.report(s.ticket, False)  # the engine failed it before a first token
    fleet.end(s.ticket, 0)
    assert fleet.prefix.match(HASHES).tolist() == [0, 0]
    s = _dispatch(acc, 1, 2)
    fleet.end(s.ticket, 0)  # the client left before a first token
    assert fleet.prefix.match(HASHES).tolist() == [0, 0]


def test_an_engine_publishing_kv_events_is_credited_from_dispatch_to_first_token_then_by_its_events():
    from steersman.fleet.kv_events import KvEventMirror

    fleet, acc = _setup()
    m = KvEventMirror()
    fleet.prefix.mirror_events(0, m)
    s = _dispatch(acc, 0, 1)
    assert fleet.prefix.match(HASHES).tolist() == [40, 0]  # routed there: its blocks count until they are cached
    assert fleet.prefix.blocks_per_replica().tolist() == [0, 0]  # nothing recorded from routing
    m.stored(HASHES[:30])  # the engine scheduled 30 blocks of it so far
    acc.first_token(s)
    assert fleet.prefix.match(HASHES).tolist() == [30, 0]  # from now on its events alone
    s2 = _dispatch(acc, 0, 2)
    fleet.report(s2.ticket, False)  # a failed attempt is let go too
    assert fleet.prefix.match(HASHES).tolist() == [30, 0]
