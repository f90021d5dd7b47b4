"""Block hashes of an int64 array in one compiled pass equal Python's tuple hashes, bit for bit."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.api.prompt import prompt_shape
from steersman.api.schema import decode_chat
from steersman.text import block_hashes, render_chat, tokenize
from steersman.text._fast_hash import AVAILABLE, fast_block_hashes
from steersman.text.chat_tokens import tokenize_chat, tokenize_chat_array
from steersman.text.tokenizer import ROOT_HASH, tokenize_array

_I64 = st.integers(-(1 << 63), (1 << 63) - 1)
# the values where CPython's int hash turns: the Mersenne modulus, -1 (hashes to -2), the int64 ends
_EDGES = st.sampled_from([0, 1, -1, -2, (1 << 61) - 1, (1 << 61) - 2, 1 << 61, -((1 << 61) - 1), -(1 << 61),
                          -(1 << 63), (1 << 63) - 1, 0xFFFFFFFF])


def _python(ids: list[int], block_size: int, parent: int) -> list[int]:
    """The definition: hash((parent, *block)) chained."""
    out, h = [], parent
    for i in range(0, len(ids) - len(ids) % block_size, block_size):
        h = hash((h, *ids[i : i + block_size]))
        out.append(h)
    return out


def test_this_python_has_the_hash_the_kernel_reproduces():
    assert AVAILABLE  # CPython, 64-bit hashes, modulus 2**61 - 1: else block_hashes stays in Python


@settings(max_examples=500, deadline=None)
@given(ids=st.lists(st.one_of(_EDGES, _I64, st.integers(0, 0xFFFFFFFF)), max_size=70),
       block_size=st.sampled_from([1, 2, 3, 16]), parent=st.one_of(_EDGES, _I64))
def test_compiled_block_hashes_equal_pythons(ids, block_size, parent):
    want = _python(ids, block_size, parent)
    assert fast_block_hashes(np.array(ids, dtype=np.int64), block_size, parent) == want
    assert block_hashes(np.array(ids, dtype=np.int64), block_size, parent) == want  # the public entry, array in
    assert block_hashes(ids, block_size, parent) == want  # and list in


def test_ids_beyond_int64_take_the_python_path():
    big = [1 << 70, 3] * 16
    assert block_hashes(big, 16, ROOT_HASH) == _python(big, 16, ROOT_HASH)
    assert block_hashes(np.array([1, 2] * 8, dtype=np.int64), 16, 1 << 70) == _python([1, 2] * 8, 16, 1 << 70)


def test_the_array_tokenizers_equal_the_list_ones():
    text = " ".join(f"doc-{i} é中 word{i}" for i in range(400))
    assert tokenize_array(text).tolist() == tokenize(text)
    assert tokenize_array("short").tolist() == tokenize("short")
    msgs = [{"role": "system", "content": "be brief " * 50}, {"role": "user", "content": text}]
    assert tokenize_chat_array(msgs).tolist() == tokenize_chat(msgs) == tokenize(render_chat(msgs))


def test_the_gateway_prompt_shape_is_unchanged():
    body = b'{"model":"m","messages":[{"role":"user","content":"' + b"alpha beta gamma " * 300 + b'"}]}'
    req = decode_chat(body, 100_000)
    n, hashes = prompt_shape(req, 16)
    ids = tokenize(render_chat([{"role": "user", "content": "alpha beta gamma " * 300}]))
    assert n == len(ids) and list(hashes) == _python(ids, 16, ROOT_HASH)


def test_a_batch_of_prompts_counts_every_prompt_and_hashes_the_first():
    import msgspec

    from steersman.api.schema import CompletionRequest
    from steersman.text import count_tokens

    shared = "Answer the question. " * 40
    prompts = [shared + "Q1?", shared + "Question two?", shared + "3?"]
    batch = msgspec.convert({"model": "m", "prompt": prompts}, CompletionRequest)
    first = msgspec.convert({"model": "m", "prompt": prompts[0]}, CompletionRequest)
    n, hashes = prompt_shape(batch, 16)
    assert n == sum(count_tokens(p) for p in prompts)
    assert tuple(hashes) == tuple(prompt_shape(first, 16)[1])
    ids = msgspec.convert({"model": "m", "prompt": [[1] * 40, [2] * 7]}, CompletionRequest)
    n, hashes = prompt_shape(ids, 16)
    assert n == 47 and len(tuple(hashes)) == 2
