"""The tokenizer's pieces and ids in one compiled pass (same ids as the regular expression, ~7x faster).

:func:`steersman.text.tokenizer.tokenize` splits text with a regular expression and
takes each piece's CRC-32; on a long prompt that is ~0.2 µs a token, and a gateway
routes every new prompt through it.  This module does the same over the text's code
points: a character class per code point (Python's own ``str`` predicates, exactly
what ``re`` uses for ``\\s``, ``\\d`` and ``\\w``: ``isspace``, ``isdecimal``,
``isalnum`` or ``_``; looked up in a table filled lazily), then one compiled loop that
applies the pattern's alternatives in order and hashes each piece's UTF-8 bytes
(``surrogatepass``) with the CRC-32 of :func:`zlib.crc32`.  ``tests/text`` checks the
ids equal the regular expression's on arbitrary Unicode text.

The pattern, alternative by alternative: an optional space then 1-8 letters
(``[^\\W\\d_]``), or 1-3 decimal digits, or 1-4 symbols (``[^\\s\\w]`` or ``_``); else a
whitespace run, less its last character when a non-space follows and the run is
longer than one (``\\s+(?!\\S)`` then ``\\s+``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

import steersman._numba_cache  # noqa: F401  (before any kernel: the cache keyed by every kernel source)

__all__ = ["fast_ids", "fast_ids_array", "warm_up"]

_SPACE, _DIGIT, _LETTER, _UNDERSCORE, _SYMBOL = 1, 2, 3, 4, 5
_MAX_CP = 0x110000
_CLASS = np.zeros(_MAX_CP, dtype=np.uint8)  # 0: not classified yet


def _classify(cp: int) -> int:
    ch = chr(cp)
    if ch.isspace():
        return _SPACE
    if ch.isdecimal():
        return _DIGIT
    if ch == "_":
        return _UNDERSCORE
    if ch.isalnum():
        return _LETTER  # word characters that are neither decimal digits nor "_" (re's [^\W\d_])
    return _SYMBOL


for _cp in range(128):
    _CLASS[_cp] = _classify(_cp)


def _crc_table() -> np.ndarray:
    t = np.zeros(256, dtype=np.int64)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t[i] = c
    return t


_TABLE = _crc_table()


@njit(cache=True, nogil=True, inline="always")
def _crc_byte(crc, b, table):
    return table[(crc ^ b) & 0xFF] ^ (crc >> 8)


@njit(cache=True, nogil=True)
def _pieces(cps, cls, table, out):
    """Writes each piece's CRC-32 to ``out``; returns how many pieces.  ``cls`` is the class table, indexed
    by code point (every code point of ``cps`` classified)."""
    n = cps.size
    m = 0
    p = 0
    while p < n:
        c = cls[cps[p]]
        lead = 0
        if cps[p] == 32 and p + 1 < n and cls[cps[p + 1]] != _SPACE:  # " word", " 123", " !?"
            lead = 1
            c = cls[cps[p + 1]]
        q = p + lead
        if lead == 1 or c != _SPACE:
            if c == _LETTER:
                lim = 8
            elif c == _DIGIT:
                lim = 3
            else:
                lim = 4
            k = 0
            while q < n and k < lim:
                d = cls[cps[q]]
                if c == _LETTER or c == _DIGIT:
                    if d != c:
                        break
                elif d != _SYMBOL and d != _UNDERSCORE:
                    break
                q += 1
                k += 1
        else:  # a whitespace run: all of it at the end of the text or when it is one character, else all but the last
            r = p
            while r < n and cls[cps[r]] == _SPACE:
                r += 1
            q = r if (r == n or r - p == 1) else r - 1
        crc = 0xFFFFFFFF
        for t in range(p, q):
            cp = np.int64(cps[t])
            if cp < 0x80:
                crc = _crc_byte(crc, cp, table)
            elif cp < 0x800:
                crc = _crc_byte(crc, 0xC0 | (cp >> 6), table)
                crc = _crc_byte(crc, 0x80 | (cp & 0x3F), table)
            elif cp < 0x10000:
                crc = _crc_byte(crc, 0xE0 | (cp >> 12), table)
                crc = _crc_byte(crc, 0x80 | ((cp >> 6) & 0x3F), table)
                crc = _crc_byte(crc, 0x80 | (cp & 0x3F), table)
            else:
                crc = _crc_byte(crc, 0xF0 | (cp >> 18), table)
                crc = _crc_byte(crc, 0x80 | ((cp >> 12) & 0x3F), table)
                crc = _crc_byte(crc, 0x80 | ((cp >> 6) & 0x3F), table)
                crc = _crc_byte(crc, 0x80 | (cp & 0x3F), table)
        out[m] = crc ^ 0xFFFFFFFF
        m += 1
        p = q
    return m


def fast_ids(text: str) -> list[int]:
    """Token ids of ``text``, equal to :func:`steersman.text.tokenizer.tokenize`'s."""
    return fast_ids_array(text).tolist()


def fast_ids_array(text: str) -> np.ndarray:
    """:func:`fast_ids` as an int64 array (no list of Python ints built)."""
    if text.isascii():
        cps = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    else:
        cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        fresh = _CLASS[cps] == 0
        if fresh.any():  # code points seen for the first time: classify them once
            for cp in np.unique(cps[fresh]).tolist():
                _CLASS[cp] = _classify(cp)
    out = np.empty(cps.size, dtype=np.int64)
    return out[: _pieces(cps, _CLASS, _TABLE, out)]


def warm_up() -> None:
    """Compile (or load) the splitter for both code-point widths, and the block hashing, now, not on the first
    request (~0.1-2 s)."""
    from steersman.text import _fast_hash

    fast_ids("warm up " * 8)
    fast_ids("warm up é " * 8)
    _fast_hash.warm_up()
