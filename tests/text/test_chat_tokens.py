"""Chat prompts tokenized message by message (with a cache) equal the whole rendered prompt tokenized."""

from __future__ import annotations

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


@settings(max_examples=400, deadline=None)
@given(_MESSAGES, st.booleans())
def test_message_by_message_equals_the_whole_prompt(messages, continue_final):
    cache = MessageTokens(1 << 20)
    whole = tokenize(render_chat(messages, continue_final=continue_final))
    assert tokenize_chat(messages, continue_final, cache) == whole
    assert tokenize_chat(messages, continue_final, cache) == whole  # again, from the cache


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
