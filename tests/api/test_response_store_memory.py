"""The in-memory response store holds what it accounts: ``bytes`` (the bound ``response_store_mib`` is checked
against) is the memory its entries take, not a fraction of it."""

from __future__ import annotations

import gc
import tracemalloc

import orjson

from steersman.api.response_store import MemoryResponseStore
from steersman.api.responses import translate_request
from steersman.api.responses_out import ResponseBuilder
from steersman.testing import FakeClock


def _turn(i: int):
    """A realistic stored turn: a 300-character question, a 1500-character answer."""
    call = translate_request(orjson.dumps({"model": "m", "input": f"question {i} " + "q" * 300}))
    answer = f"answer {i} " + "a" * 1500
    resp = ResponseBuilder(call, "m", 0).response("completed", [{
        "type": "message", "id": f"msg_{i}", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": answer, "annotations": [], "logprobs": []}]}])
    return resp, call.history + [{"role": "assistant", "content": answer}], call.input_items


def test_the_memory_it_holds_is_the_memory_it_accounts():
    store = MemoryResponseStore(2**30, 3600.0, FakeClock())
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(300):
            store.put("t", *_turn(i))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(store) == 300 and store.bytes > 300 * 2000
    # each entry's record plus its key and slot (~10%), not orjson's over-allocation and the decoded dicts (~4x)
    assert held < 1.25 * store.bytes, (held, store.bytes)


def test_an_entry_reads_back_as_it_was_put():
    clock = FakeClock()
    store = MemoryResponseStore(10**6, 60.0, clock)
    resp, conversation, items = _turn(1)
    store.put("t", resp, conversation, items)
    got = store.lookup("t", resp["id"])
    assert orjson.loads(got.response) == resp and list(got.conversation) == conversation
    assert list(got.input_items) == items and got.expires == 60.0 and got.size == store.bytes
