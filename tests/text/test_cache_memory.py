"""The message token cache holds what it accounts: its ``nbytes`` (bounded by ``engine.message_token_cache_mib``) is
the memory its entries take.  Short messages held ~1.2x what it counted (memory audit, thirty-fifth session: each
entry's ordered-dict node, key tuple and array header were counted as 200 bytes)."""

import gc
import sys
import tracemalloc

import pytest

from steersman.text.chat_tokens import MessageTokens
from steersman.text.tokenizer import tokenize_array


@pytest.mark.parametrize("length", [10, 60, 400])
def test_the_memory_it_holds_is_the_memory_it_accounts(length):
    texts = [f"m{i} " + "x" * length for i in range(40000)]  # (longer than the tokenizer's own piece cache takes)
    tokenize_array("warm up " * 10)
    cache = MessageTokens(4 * 2**20)
    gc.collect()
    tracemalloc.start()
    try:
        for t in texts:
            cache.ids("user", t)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    held += sum(sys.getsizeof(text) for _, text in cache._d)  # the texts it keeps alive (made before tracing)
    assert len(cache) < len(texts)  # full: it evicted
    assert 0.85 * cache.nbytes < held < 1.1 * cache.nbytes, (held, cache.nbytes)
