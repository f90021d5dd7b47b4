"""Chat prompts tokenized message by message (with a cache) equal the whole rendered prompt tokenized."""

from __future__ import annotations

import statistics
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.text import render_chat, tokenize, tokenize_chat
from steersman.text.chat_tokens import MessageTokens

# text that stresses the tokenizer's piece boundaries: whitespace runs, symbols, digits, letters,
# non-ASCII, and the chat template's own markers inside content
_ALPHABET = st.sampled_from(list(" \n\t\r  ab_Z9!<|>é中\u200b") + ["<|im_end|>\n", "<|im_start|>", "  ", "\n\n"])
_TEXT = st.lists(_ALPHABET, max_size=40).map("".join)
_ROLE = st.sampled_from(["system", "user", "assistant", "tool"])
_MESSAGES = st.lists(st.fixed_dictionaries({"role": _ROLE, "content": _TEXT}), min_size=1, max_size=6)


# what else a chat brings into the prompt: tool calls (arguments a JSON string or not), parts (text, an image, audio)
_CALL = st.fixed_dictionaries({"id": _TEXT, "type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": _TEXT, "arguments": st.one_of(_TEXT, st.dictionaries(_TEXT, _TEXT, max_size=2))})})
_PART = st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}),
                  st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": _TEXT})}),
                  st.fixed_dictionaries({"type": st.just("input_audio"), "input_audio": st.fixed_dictionaries(
                      {"data": _TEXT, "format": st.just("wav")})}))
_RICH = st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
                               "content": st.one_of(st.none(), _TEXT, st.lists(_PART, max_size=3))},
                              optional={"tool_calls": st.lists(_CALL, max_size=2)})
_TOOLS = st.one_of(st.none(), st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": _TEXT, "description": _TEXT})}), max_size=2))


@settings(max_examples=400, deadline=None)
@given(_MESSAGES, st.booleans())
def test_message_by_message_equals_the_whole_prompt(messages, continue_final):
    cache = MessageTokens(1 << 20)
    whole = tokenize(render_chat(messages, continue_final=continue_final))
    assert tokenize_chat(messages, continue_final, cache) == whole
    assert tokenize_chat(messages, continue_final, cache) == whole  # again, from the cache


@settings(max_examples=300, deadline=None)
@given(st.lists(_RICH, min_size=1, max_size=5), st.booleans(), _TOOLS)
def test_tools_tool_calls_and_parts_keep_the_equality(messages, continue_final, tools):
    cache = MessageTokens(1 << 20)
    whole = tokenize(render_chat(messages, continue_final, tools))
    assert tokenize_chat(messages, continue_final, cache, tools) == whole
    assert tokenize_chat(messages, continue_final, cache, tools) == whole
    if tools:  # the tools are in the prompt
        assert len(whole) > len(tokenize(render_chat(messages, continue_final)))


def test_a_shared_system_prompt_is_tokenized_once():
    cache = MessageTokens(1 << 20)
    system = {"role": "system", "content": "You are a careful assistant. " * 200}
    for i in range(5):
        tokenize_chat([system, {"role": "user", "content": f"question {i}"}], cache=cache)
    assert cache.misses == 1 + 5 and cache.hits == 4


def test_the_cache_stays_under_its_budget_and_drops_the_least_recently_used():
    cache = MessageTokens(64 * 1024)
    keep = {"role": "system", "content": "shared " * 300}
    for i in range(400):
        tokenize_chat([keep, {"role": "user", "content": f"unique {i} " * 50}], cache=cache)
        assert cache.nbytes <= cache.max_bytes
    assert 0 < len(cache) < 400  # unique messages were dropped...
    hits = cache.hits
    tokenize_chat([keep], cache=cache)
    assert cache.hits == hits + 1  # ...the one used by every request was not
    huge = {"role": "user", "content": "x " * 100_000}  # larger than the whole cache: answered, not kept
    assert tokenize_chat([huge], cache=cache) == tokenize(render_chat([huge]))
    assert cache.nbytes <= cache.max_bytes


def test_the_cache_keeps_only_the_ids_not_the_tokenizers_buffer():
    # the compiled tokenizer fills a buffer sized by characters; a cached message must not hold it (its cost
    # counts 8 bytes per id)
    cache = MessageTokens(1 << 20)
    text = "a long message to cache " * 100
    tokenize_chat([{"role": "user", "content": text}], cache=cache)
    (ids,) = cache._d.values()
    assert ids.base is None and not ids.flags.writeable and ids.nbytes == 8 * ids.size


def _per_message_seconds(cache: MessageTokens, keys: list[str], chunk: int = 1000) -> float:
    """Median CPU time of a chunk of ``ids`` calls (this thread's: other processes' load does not count)."""
    times = []
    for s in range(0, len(keys), chunk):
        t = time.thread_time()
        for k in keys[s : s + chunk]:
            cache.ids("user", k)
        times.append(time.thread_time() - t)
    return statistics.median(times)


def test_a_full_cache_evicts_in_constant_time():
    """Once full, every new message evicts the least recently used one.  On a plain dict (pop and re-insert on a
    hit, ``next(iter(d))`` to evict) each eviction walked the deleted slots at the front: quadratic, one 200k-message
    request stalled the gateway's event loop for ~20 s.  Evicting misses must cost about what plain misses do (a
    ratio, so the machine's speed does not matter; the dict took 2.6-4x at this size, the OrderedDict ~1x)."""
    keys = [f"m{i}" for i in range(40_000)]
    fresh = MessageTokens(1e12)
    plain = _per_message_seconds(fresh, keys)  # every message a miss, nothing evicted
    cache = MessageTokens(fresh.nbytes * 0.85)
    _per_message_seconds(cache, keys)
    evicting = _per_message_seconds(cache, keys)  # every message a miss again (LRU, scanned in order), each evicting
    assert cache.nbytes <= cache.max_bytes and cache.misses == 2 * len(keys) and cache.hits == 0
    assert evicting < 2.0 * plain, (evicting, plain)


def test_the_least_recently_used_message_is_evicted_first():
    cache = MessageTokens(1e12)
    for k in ("a", "b", "c"):
        cache.ids("user", k)
    cache.ids("user", "a")  # a hit: now the most recent
    cache.max_bytes = cache.nbytes  # full
    cache.ids("user", "d")
    assert [t for _, t in cache._d] == ["c", "a", "d"]  # "b", the least recent, went first
