"""The compiled splitter gives exactly the regular expression's token ids, on any text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.text._fast_tokenize import fast_ids
from steersman.text.tokenizer import _regex_ids, tokenize

# pieces that meet at every boundary the pattern has: runs of letters/digits/symbols longer than their
# caps, single and repeated spaces before each class, other whitespace, underscores, non-ASCII letters,
# digits and numerals that are not decimal, marks, surrogates
_PARTS = st.sampled_from([" ", "  ", "\n", "\n\n", "\t", "\u3000", "\u00a0", "a", "abcdefghijk", "Z", "é", "中文",
                          "1", "12345", "\u00b2", "\u2460", "\u0663", "_", "__", "!", "?!.,;:", "-", "\u0301",
                          "\ud800", "\U0001f600", "x_y", "<|im_end|>"])


@settings(max_examples=600, deadline=None)
@given(st.lists(_PARTS, max_size=30).map("".join))
def test_pattern_boundaries(text):
    assert fast_ids(text) == _regex_ids(text)


@settings(max_examples=600, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_unicode(text):
    assert fast_ids(text) == _regex_ids(text)
    assert tokenize(text) == _regex_ids(text)  # whichever path its length takes
