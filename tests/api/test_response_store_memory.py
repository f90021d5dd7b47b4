"""The in-memory response store holds what it accounts: ``bytes`` (the bound ``response_store_mib`` is checked
against) is the memory its entries take, not a fraction of it."""

from __future__ import annotations

import gc
import tracemalloc

import orjson
import pytest

from steersman.api.response_store import _ENTRY_BYTES, MemoryResponseStore
from steersman.api.responses import translate_request
from steersman.api.responses_out import ResponseBuilder
from steersman.testing import FakeClock


def _turn(i: int, q: int = 300, a: int = 1500):
    """A realistic stored turn: a 300-character question, a 1500-character answer (or ``q`` and ``a`` characters)."""
    call = translate_request(orjson.dumps({"model": "m", "input": f"question {i} " + "q" * q}))
    answer = f"answer {i} " + "a" * a
    resp = ResponseBuilder(call, "m", 0).response("completed", [{
        "type": "message", "id": f"msg_{i}", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": answer, "annotations": [], "logprobs": []}]}])
    return resp, call.history + [{"role": "assistant", "content": answer}], call.input_items


@pytest.mark.parametrize("q, a, n", [(300, 1500, 300), (5, 20, 3000)])
def test_the_memory_it_holds_is_the_memory_it_accounts(q, a, n):
    """Short turns (750-byte records) held 1.58x what the store counted: each entry's key, slot and tuples were not
    counted (memory audit, thirty-fifth session)."""
    turns = [_turn(i, q, a) for i in range(n)]
    store = MemoryResponseStore(2**30, 3600.0, FakeClock())
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for t in turns:
            store.put("t", *t)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(store) == n
    # each entry's record and what holds it, not orjson's over-allocation and the decoded dicts (~4x)
    assert 0.8 * store.bytes < held < 1.1 * store.bytes, (held, store.bytes)


def test_an_entry_reads_back_as_it_was_put():
    clock = FakeClock()
    store = MemoryResponseStore(10**6, 60.0, clock)
    resp, conversation, items = _turn(1)
    store.put("t", resp, conversation, items)
    got = store.lookup("t", resp["id"])
    assert orjson.loads(got.response) == resp and list(got.conversation) == conversation
    assert list(got.input_items) == items and got.expires == 60.0 and got.size + _ENTRY_BYTES == store.bytes
