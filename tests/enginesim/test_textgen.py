from hypothesis import given, settings, strategies as st

from steersman.enginesim.textgen import generate
from steersman.text import render_chat, tokenize

MSGS = [{"role": "user", "content": "Tell me about prefix caching."}]


def _gen(prompt: str, n: int, **kw):
    return generate(prompt, prompt[-1:], n, 211, **kw)


def test_deterministic_and_bounded():
    p = render_chat(MSGS)
    a, b = _gen(p, 50, ignore_eos=True), _gen(p, 50, ignore_eos=True)
    assert a.pieces == b.pieces and len(a.pieces) == 50 and a.finish_reason == "length"
    assert tokenize(a.text) == [t for piece in a.pieces for t in tokenize(piece)]


@settings(max_examples=60, deadline=None)
@given(k=st.integers(min_value=1, max_value=79))
def test_chat_continuation_is_token_exact(k):
    p = render_chat(MSGS)
    full = _gen(p, 80, ignore_eos=True)
    prefix = "".join(full.pieces[:k])
    cont_prompt = render_chat(MSGS + [{"role": "assistant", "content": prefix}], continue_final=True)
    rest = _gen(cont_prompt, 80 - k, ignore_eos=True)
    assert rest.pieces == full.pieces[k:]


def test_completion_continuation_is_token_exact():
    p = "Once upon a time"
    full = _gen(p, 60, ignore_eos=True)
    rest = _gen(p + "".join(full.pieces[:25]), 35, ignore_eos=True)
    assert rest.pieces == full.pieces[25:]


def test_eos_gives_geometric_lengths_near_the_mean():
    lengths = []
    for i in range(300):
        g = generate(f"prompt number {i}", "x", 5000, 50)
        assert g.finish_reason == "stop"
        lengths.append(len(g.pieces))
    mean = sum(lengths) / len(lengths)
    assert 35 < mean < 65


def test_stop_string_truncates_text():
    p = render_chat(MSGS)
    full = _gen(p, 60, ignore_eos=True)
    word = full.pieces[10]
    g = _gen(p, 60, ignore_eos=True, stop=[word])
    assert g.finish_reason == "stop"
    assert word not in g.text and full.text.startswith(g.text)
    assert "".join(g.pieces) == g.text


def test_stop_strings_end_the_output_where_vllm_does():
    """vLLM checks the text after each token: every token up to the one completing the stop string counts, the first
    stop string to complete wins, and include_stop_str_in_output keeps it."""
    p = "The river"
    full = _gen(p, 30, ignore_eos=True)
    pieces = full.pieces
    spanning = "".join(pieces[5:8])  # a stop string over tokens 5..7
    assert full.text.find(spanning) == len("".join(pieces[:5]))
    g = _gen(p, 30, ignore_eos=True, stop=[spanning])
    assert (len(g.pieces), g.finish_reason, g.text) == (8, "stop", "".join(pieces[:5]))
    assert "".join(g.pieces) == g.text
    late_start_early_end = ["".join(pieces[0:6]), pieces[1]]  # the second completes first (token 1)
    assert pieces[1] not in pieces[0]
    g = _gen(p, 30, ignore_eos=True, stop=late_start_early_end)
    assert (len(g.pieces), g.text) == (2, pieces[0])
    g = _gen(p, 30, ignore_eos=True, stop=[spanning], include_stop=True)
    assert (len(g.pieces), g.finish_reason, g.text) == (8, "stop", "".join(pieces[:8])) and "".join(g.pieces) == g.text


def test_min_tokens_holds_off_eos_and_stop_strings():
    p = "The river"
    full = _gen(p, 30, ignore_eos=True)
    early = full.pieces[2]
    assert early not in "".join(full.pieces[:2])
    assert len(_gen(p, 30, ignore_eos=True, stop=[early]).pieces) == 3
    g = _gen(p, 30, ignore_eos=True, stop=[early], min_tokens=5)
    assert len(g.pieces) > 5 and g.text.startswith("".join(full.pieces[:5]))
    lengths = [len(generate(f"prompt number {i}", "x", 500, 5, min_tokens=20).pieces) for i in range(50)]
    assert min(lengths) >= 20 and min(len(generate(f"prompt number {i}", "x", 500, 5).pieces) for i in range(50)) < 20
