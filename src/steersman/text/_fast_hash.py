"""Chained block hashes of an int64 token-id array in one compiled pass, bit for bit Python's own.

:func:`steersman.text.tokenizer.block_hashes` hashes each block as the tuple ``(parent,
*ids)``; on a long prompt that is ~0.25 µs a block in the interpreter.  This computes the
same values: CPython's tuple hash (``Objects/tupleobject.c``, the xxHash-style
accumulation since 3.8: lanes multiplied by XXPRIME_2, rotated left 31 bits, multiplied
by XXPRIME_1, the length mixed in at the end) over CPython's int hash (the value modulo
the Mersenne prime 2**61 - 1 with the sign kept, -1 mapped to -2).  Int and tuple hashes
do not depend on ``PYTHONHASHSEED``, so every process agrees, compiled or not;
``tests/text/test_fast_hash.py`` checks the equality on arbitrary ids and parents.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import njit

import steersman._numba_cache  # noqa: F401  (before any kernel: the cache keyed by every kernel source)

__all__ = ["AVAILABLE", "fast_block_hashes", "warm_up"]

#: the formulas hold for CPython with 64-bit hashes (``sys.hash_info``: siphash13 or siphash24 for str only)
AVAILABLE = sys.implementation.name == "cpython" and sys.hash_info.width == 64 and sys.hash_info.modulus == (1 << 61) - 1

_P1 = np.uint64(11400714785074694791)
_P2 = np.uint64(14029467366897019727)
_P5 = np.uint64(2870177450012600261)
_MOD = np.uint64((1 << 61) - 1)
_R31, _R33 = np.uint64(31), np.uint64(33)
_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


@njit(cache=True, inline="always")
def _int_lane(x):
    """hash(x) of an int64 as the uint64 bits of the Py_hash_t."""
    if x >= 0:
        return np.uint64(x) % _MOD
    h = (np.uint64(0) - np.uint64(x)) % _MOD  # |x|, also for -2**63
    if h == np.uint64(1):
        h = np.uint64(2)  # hash(-1) is -2
    return np.uint64(0) - h


@njit(cache=True, inline="always")
def _mix(acc, lane):
    acc = acc + lane * _P2
    acc = (acc << _R31) | (acc >> _R33)
    return acc * _P1


@njit(cache=True)
def _chain(ids, n_blocks, block_size, parent, out):
    tail = np.uint64(block_size + 1) ^ (_P5 ^ np.uint64(3527539))
    h = parent
    for b in range(n_blocks):
        acc = _mix(_P5, _int_lane(h))
        base = b * block_size
        for j in range(block_size):
            acc = _mix(acc, _int_lane(ids[base + j]))
        acc = acc + tail
        if acc == _ALL_ONES:
            h = np.int64(1546275796)
        else:
            h = np.int64(acc)  # the same 64 bits, signed
        out[b] = h


def fast_block_hashes(ids: np.ndarray, block_size: int, parent: int) -> list[int]:
    """``block_hashes(ids.tolist(), block_size, parent)`` for an int64 array and an int64 ``parent``."""
    return fast_block_hash_array(ids, block_size, parent).tolist()


def fast_block_hash_array(ids: np.ndarray, block_size: int, parent: int) -> np.ndarray:
    """:func:`fast_block_hashes` as an int64 array."""
    n = ids.size // block_size
    out = np.empty(n, dtype=np.int64)
    _chain(ids, n, block_size, np.int64(parent), out)  # returns nothing: boxing a returned array unpickles its type
    return out


def warm_up() -> None:
    """Compile (or load) the kernel now, not on the first long prompt."""
    fast_block_hashes(np.zeros(16, dtype=np.int64), 16, 0)
