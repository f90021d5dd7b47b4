"""PrefixIndex.match is memoised per hashes object until the next write (the policy's match is the accounting's)."""

import numpy as np
import pytest

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
