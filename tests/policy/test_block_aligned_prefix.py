"""What a replica is predicted to reuse of a prompt is capped at ``(prompt_tokens - 1) // block_size`` blocks.

The engine computes a prompt's last token whatever it holds (vLLM v1 ``get_computed_blocks``: ``max_cache_hit_length =
num_tokens - 1``; ``steersman.sim.kvcache`` the same), so of a block-aligned prompt of ``k`` blocks it reuses ``k - 1``.
Every consumer of steersman's ``prefix_held`` (predictions, scorers, the dispatch's predicted hit that the prefix
accuracy learns from) sees that; the baselines' ``prefix-match`` stays the index's full-block match, as the routers
they reproduce (llm-d, Dynamo, SGLang) match without that cap.  The twin's end-to-end case:
``tests/twin/test_block_aligned_reuse.py``.
"""

from __future__ import annotations

from steersman.config import DEFAULTS
from steersman.control.accounting import Accounting
from steersman.control.plane import Dispatch
from steersman.engines.openai_http import OpenAIHttpAdapter
from steersman.fleet import snapshot as S
from steersman.fleet.prefix_index import PrefixIndex
from steersman.fleet.state import Fleet, Replica
from steersman.policy.base import Route
from steersman.policy.framework import DecisionContext
from steersman.testing.clock import FakeClock
from steersman.testing.snapshots import chain, fleet_snapshot, prefix_index, sched_request

import steersman.policy.baselines.common  # noqa: F401  (registers the prefix-match feature)

HASHES = chain("aligned", 2)


def _features(prompt_tokens: int, hashes=HASHES) -> DecisionContext:
    snap = fleet_snapshot(2, prefix=prefix_index(2, {0: hashes}))
    req = sched_request(prompt_tokens=prompt_tokens, hashes=hashes)
    return DecisionContext(snap, req, snap.candidates(req.model))


def test_a_block_aligned_prompt_is_predicted_to_reuse_one_block_less():
    ctx = _features(32)
    assert ctx.feature("prefix_held").tolist() == [1, 0]
    assert ctx.feature("prefix_held_raw").tolist() == [1, 0]
    assert ctx.feature("prefix_blocks").tolist() == [1.0, 0.0]
    assert ctx.feature("uncached_tokens").tolist() == [16.0, 32.0]  # a whole block recomputed, not one token
    assert ctx.feature("prefix-match").tolist() == [2, 0]  # the baselines' match: full blocks, as their routers


def test_an_unaligned_prompt_is_unchanged():
    ctx = _features(33)
    assert ctx.feature("prefix_held").tolist() == [2, 0]
    assert ctx.feature("uncached_tokens").tolist() == [1.0, 33.0]
    ctx = _features(47)
    assert ctx.feature("prefix_held").tolist() == [2, 0]
    assert ctx.feature("uncached_tokens").tolist() == [15.0, 47.0]


def test_a_one_block_prompt_is_predicted_to_reuse_nothing():
    ctx = _features(16, HASHES[:1])
    assert ctx.feature("prefix_held").tolist() == [0, 0]
    assert ctx.feature("uncached_tokens").tolist() == [16.0, 16.0]


def test_the_dispatch_predicts_the_capped_hit_and_learns_no_false_miss():
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "vllm", None, ("m",), "p", 1.0, 1,
                    adapter=OpenAIHttpAdapter("vllm")) for i in range(2)]
    fleet = Fleet(reps, FakeClock(start=5.0))
    fleet.prefix = PrefixIndex(2, 8 * 2**20)
    acc = Accounting(fleet, None, None, DEFAULTS.scheduler, 16)
    req = sched_request(1, model="m", prompt_tokens=32, hashes=HASHES)
    first = acc.dispatched(req, Dispatch(Route(0, "test"), None))
    assert (first.predicted_hit_blocks, first.uncached) == (0, 32)
    again = acc.dispatched(sched_request(2, model="m", prompt_tokens=32, hashes=HASHES), Dispatch(Route(0, "test"), None))
    assert (again.predicted_hit_blocks, again.uncached) == (1, 16)
    fleet.observe_prefix(0, again.predicted_hit_blocks, 16 // 16)  # what vLLM reports at its end: one block
    assert fleet.live[S.PREFIX_ACCURACY, 0] == 1.0


def test_reusable_is_the_match_unless_capped_and_memoised_with_it():
    idx = prefix_index(2, {0: HASHES, 1: HASHES[:1]})
    assert idx.reusable(HASHES, 33, 16) is idx.match(HASHES)  # nothing to cap: no copy
    capped = idx.reusable(HASHES, 32, 16)
    assert capped.tolist() == [1, 1] and not capped.flags.writeable
    assert idx.reusable(HASHES, 32, 16) is capped  # until the next write
    assert idx.reusable(HASHES, 32, 16, raw=True).tolist() == [1, 1]
    idx.record(1, HASHES)
    assert idx.reusable(HASHES, 32, 16) is not capped and idx.match(HASHES).tolist() == [2, 2]
    assert idx.reusable(HASHES, 0, 16).tolist() == [0, 0]  # no prompt: nothing reused
