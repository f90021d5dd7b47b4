"""PrefixIndex.match is memoised per hashes object until the next write (the policy's match is the accounting's)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.fleet.prefix_index import PrefixIndex

MiB = 1 << 20
SYS = [(7919 * i + 13) * 2654435761 % (1 << 61) for i in range(30)]
A = SYS + [(104729 * i + 1) % (1 << 61) for i in range(10)]


def test_match_is_memoised_until_a_write_and_read_only():
    idx = PrefixIndex(3, 4 * MiB)
    idx.record(0, A)
    m = idx.match(A)
    assert m.tolist() == [40, 0, 0]
    assert idx.match(A) is m  # the same object: no second walk
    with pytest.raises(ValueError):
        m[0] = 1  # shared by every caller: read-only
    assert idx.match(list(A)) is not m and idx.match(list(A)).tolist() == m.tolist()  # another object: computed
    a = list(A)
    held = idx.match(a)
    idx.record(1, SYS)  # a write invalidates
    assert idx.match(a) is not held and idx.match(a).tolist() == [40, 30, 0]
    idx.correct(1, a, 10)
    assert idx.match(a).tolist() == [40, 10, 0]
    idx.forget_replica(0)
    assert idx.match(a).tolist() == [0, 10, 0]
    a.append(5)  # the same list grown in place is not mistaken for the memoised one
    assert idx.match(a).tolist() == [0, 10, 0]
    assert isinstance(idx.match(a), np.ndarray)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["record", "match", "correct", "forget", "blocks", "flush"]),
                              st.integers(0, 3), st.integers(0, 5), st.integers(1, 40)), min_size=1, max_size=40))
def test_record_later_reads_as_if_recorded_at_once(ops):
    """The gateway defers its dispatch record to after the upstream write: nothing may tell the difference."""
    now, later = PrefixIndex(4, 2 * MiB), PrefixIndex(4, 2 * MiB)
    prompts = [SYS[: 5 * k] + [(k * 1_000_003 + j) * 97 % (1 << 61) for j in range(40)] for k in range(6)]
    for op, r, p, n in ops:
        hashes = prompts[p][:n]
        if op == "record":
            now.record(r, hashes)
            later.record_later(r, hashes)
        elif op == "match":
            assert now.match(hashes).tolist() == later.match(hashes).tolist()
        elif op == "correct":
            now.correct(r, hashes, n // 2)
            later.correct(r, hashes, n // 2)
        elif op == "forget":
            now.forget_replica(r)
            later.forget_replica(r)
        elif op == "blocks":
            assert now.blocks_view().tolist() == later.blocks_view().tolist()
            assert now.blocks_per_replica().tolist() == later.blocks_per_replica().tolist()
        else:
            later.flush()
    assert len(now) == len(later) and now.nbytes_estimate() == later.nbytes_estimate()
