"""A prompt of an exact multiple of the block size: the engine reuses one block less than it holds.

vLLM (v1 ``KVCacheManager.get_computed_blocks``: ``max_cache_hit_length = request.num_tokens - 1``) and the engine
model (``steersman.sim.kvcache``: ``limit = (ntok - 1) // bs``) must compute a prompt's last token, so of a prompt of
``k`` full blocks at most ``k - 1`` are reused.  The gateway's prediction is capped the same way
(``PrefixIndex.reusable``): it predicted all ``k``, so the learnt prefix accuracy (observed / predicted hit) of a
replica serving a repeated 32-token prompt drifted to 1/2, and the predicted prefill was one token where the engine
recomputes a whole block.
"""

from __future__ import annotations

from steersman.fleet import snapshot as S
from steersman.policy import make_policy
from steersman.testing import ReplayWorkload
from steersman.testing.replay import arrival
from steersman.twin import ReplicaPlan, Twin, TwinFleet

MODEL = "llama-3.1-8b"


def _accuracy(prompt_tokens: int, blocks: int) -> tuple[float, int]:
    """The learnt prefix accuracy of the replica serving the same prompt 20 times, one at a time."""
    hashes = tuple(hash(("aligned", i)) for i in range(blocks))
    items = [arrival(0.5 * i, i, prompt_tokens=prompt_tokens, block_hashes=hashes, output_tokens=4, max_tokens=4)
             for i in range(20)]
    twin = Twin(TwinFleet([ReplicaPlan("r0", "H100", MODEL)]), ReplayWorkload(items), make_policy("steersman"))
    twin.run()
    return float(twin.fleet.live[S.PREFIX_ACCURACY, 0]), int(twin.fleet.prefix.match(hashes)[0])


def test_a_repeated_block_aligned_prompt_keeps_its_prefix_accuracy():
    acc, indexed = _accuracy(32, 2)
    assert indexed == 2  # the index still records both blocks: the engine caches them (and longer prompts reuse both)
    assert acc > 0.99, acc  # was 0.5: 2 blocks predicted, 1 reused


def test_a_repeated_unaligned_prompt_is_unchanged():
    acc, indexed = _accuracy(33, 2)
    assert indexed == 2 and acc > 0.99, acc
    acc, _ = _accuracy(40, 2)
    assert acc > 0.99, acc


def test_the_engine_model_reuses_one_block_less_of_a_block_aligned_prompt():
    """``steersman.sim``'s own cap (the reality the prediction must match)."""
    from steersman.sim.kvcache import KVPool
    from steersman.sim.request import SimRequest

    kv = KVPool(64, 16)
    hashes = tuple(hash(("aligned", i)) for i in range(2))
    first = SimRequest(req_id="a", prompt_len=32, max_output=1, block_hashes=hashes)
    assert kv.admit(first, 4096, True) == (0, 32)
    kv.free(first)  # done: its two full blocks stay cached
    again = SimRequest(req_id="b", prompt_len=32, max_output=1, block_hashes=hashes)
    assert kv.admit(again, 4096, True, dry=True) == (1, 16)
    longer = SimRequest(req_id="c", prompt_len=33, max_output=1, block_hashes=hashes)
    assert kv.admit(longer, 4096, True, dry=True) == (2, 1)
