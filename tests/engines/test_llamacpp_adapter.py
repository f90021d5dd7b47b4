"""llama.cpp adapter against real llama-server pages (recorded by scripts/record-llamacpp-samples.py)."""

import json
from pathlib import Path

import pytest

from steersman.engines.llamacpp import SlotState, llamacpp_metrics, parse_slots

DATA = Path(__file__).parent / "data"


def _page(tag: str) -> str:
    return (DATA / f"llamacpp_metrics_{tag}.txt").read_text()


def _slots(tag: str) -> list[SlotState]:
    return parse_slots(json.loads((DATA / f"llamacpp_slots_{tag}.json").read_text()))


def test_idle_server_after_a_prefix_hit():
    # two requests sharing a system prompt: the second computed only its suffix; a pool per slot (-np 4, no -kvu: as
    # steersman starts llama-server, and says so; see test_llamacpp_kv_unified.py)
    m = llamacpp_metrics(_page("idle"), _slots("idle"), block_size=16, kv_unified=False)
    assert (m.num_running, m.num_waiting) == (0, 0)
    assert m.prefix_hits == 409  # llamacpp:prompt_tokens_cached_total
    assert m.prefix_queries == 423 + 409  # processed (cached excluded) + cached
    assert m.kv_usage == 0.0  # nothing processing: held prefixes are reusable cache, not load
    assert m.kv_blocks_total == 4 * 2048 / 16  # -np 4 slots of 2048 tokens (-c 8192)


def test_idle_slots_keep_the_prefix_they_hold():
    slots = _slots("idle")
    assert [s.id for s in slots] == [0, 1, 2, 3]
    assert not any(s.processing for s in slots)
    assert max(s.held_tokens for s in slots) == 423  # the shared prompt stays in one slot's KV


def test_busy_server_running_and_deferred():
    slots = _slots("busy")
    m = llamacpp_metrics(_page("busy"), slots, block_size=16, kv_unified=False)
    assert (m.num_running, m.num_waiting) == (2, 2)  # -np 2: two decode, two wait for a slot
    assert all(s.processing and s.decoded > 0 for s in slots)
    assert m.kv_usage == pytest.approx((425 + 426) / 8192)
    assert m.kv_blocks_total == 8192 / 16


def test_metrics_without_slots_still_read_the_load():
    m = llamacpp_metrics(_page("busy"), None)
    assert (m.num_running, m.num_waiting, m.kv_usage, m.kv_blocks_total) == (2, 2, 0.0, None)


@pytest.mark.parametrize("bad", [{"error": "disabled"}, [{"n_ctx": 1}], "x"])
def test_not_a_slot_list_is_refused(bad):
    with pytest.raises(ValueError):
        parse_slots(bad)


def test_the_engines_own_timing_of_its_work_is_read():
    idle = llamacpp_metrics(_page("idle"), _slots("idle"), block_size=16)
    # llamacpp:prompt_seconds_total over the prompt tokens it computed; generation seconds over tokens generated
    assert (idle.prefill_seconds, idle.prefill_tokens) == (pytest.approx(1.34942), 423)
    assert (idle.decode_seconds, idle.decode_tokens) == (pytest.approx(0.541483), 16)
    busy = llamacpp_metrics(_page("busy"), None)
    assert (busy.prefill_seconds, busy.prefill_tokens, busy.decode_tokens) == (pytest.approx(2.67121), 836, 0)


def test_a_named_tool_choice_is_sent_as_required_over_that_function_alone():
    import orjson

    from steersman.engines.llamacpp import named_tool_choice

    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("a", "b")]
    body = orjson.dumps({"model": "m", "messages": [], "tools": tools,
                         "tool_choice": {"type": "function", "function": {"name": "b"}}})
    out = orjson.loads(named_tool_choice(body))
    assert out["tool_choice"] == "required" and out["tools"] == tools[1:]
    assert {k: v for k, v in out.items() if k not in ("tools", "tool_choice")} == {"model": "m", "messages": []}
    for same in (orjson.dumps({"tools": tools, "tool_choice": "auto"}),
                 orjson.dumps({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "zz"}}}),
                 b'{"tool_choice": {"type": "function", "function": {"name": "a"}}}', b"not json", b"[1]"):
        assert named_tool_choice(same) == same
