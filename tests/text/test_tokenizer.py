from hypothesis import given, strategies as st

from steersman.text import block_hashes, count_tokens, render_chat, tokenize
from steersman.text.tokenizer import pieces


@given(st.text(max_size=400))
def test_pieces_cover_text_exactly(text):
    assert "".join(pieces(text)) == text
    assert count_tokens(text) == len(tokenize(text))


def test_english_is_near_four_chars_per_token():
    text = "The quick brown fox jumps over the lazy dog, and then it runs away to the river bank. " * 20
    ratio = len(text) / count_tokens(text)
    assert 3.0 < ratio < 5.5


def test_block_hashes_are_chained_prefix_identities():
    a = tokenize("shared system prompt " * 40 + "question one")
    b = tokenize("shared system prompt " * 40 + "another question entirely")
    ha, hb = block_hashes(a), block_hashes(b)
    assert len(ha) == len(a) // 16
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    shared_blocks = common // 16
    assert ha[:shared_blocks] == hb[:shared_blocks]
    assert ha[shared_blocks:] != hb[shared_blocks:] or len(ha) == shared_blocks
    # chaining: the same block content after a different prefix hashes differently
    c = tokenize("x " + "shared system prompt " * 40)
    assert set(block_hashes(c)).isdisjoint(set(ha[:2]))


def test_token_ids_are_stable_across_processes():
    import subprocess
    import sys

    code = "from steersman.text import tokenize, block_hashes; print(block_hashes(tokenize('hello world ' * 20))[-1])"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONHASHSEED": s}).stdout for s in ("1", "2")}
    assert len(outs) == 1 and outs.pop().strip()


def test_render_chat_and_continuation_prefix():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    p = render_chat(msgs)
    assert p.endswith("<|im_start|>assistant\n")
    cont = render_chat(msgs + [{"role": "assistant", "content": "Hel"}], continue_final=True)
    assert cont == p + "Hel"
