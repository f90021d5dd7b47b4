"""Sizing of the prefix index: how many generations of which table size fit a memory budget.

CPython's dict layout is measured once (bytes per table slot, bytes per block-hash int)
rather than assumed, so the budget holds on the interpreter that runs it.
"""

from __future__ import annotations

import functools
import sys

_MIN_GENS, _MAX_GENS = 2, 8  # generations (the filter has one bit per generation in a byte)


@functools.cache
def measured_costs() -> tuple[float, int]:
    """(bytes per table slot of a large int-keyed dict, bytes per block-hash int object), measured once."""
    k = 17  # 4-byte index entries, as for every table size the index uses
    d = {key: None for key in range(1 << 62, (1 << 62) + (2 << k) // 3)}
    slot = (sys.getsizeof(d) - sys.getsizeof({})) / (1 << k)
    key = -(-sys.getsizeof(-(1 << 62)) // 16) * 16  # a 64-bit hash, rounded up to pymalloc's 16-byte classes
    return slot, key


def layout(max_bytes: float, fixed: float) -> tuple[int, int, int]:
    """(log2 table slots of a generation, its entries, number of generations) that hold the most."""
    slot, key = measured_costs()
    best = None
    for k in range(6, 30):
        usable = (2 << k) // 3  # CPython's USABLE_FRACTION of a 2**k table
        table = slot * (1 << k)
        free = max_bytes - fixed - (8 << k) - table / 2  # the filter: 8 x 2**k one-byte slots
        gens = min(_MAX_GENS, int(free // (table + usable * key)))
        if gens >= _MIN_GENS:
            held = (gens - 0.5) * usable  # on average the oldest generation is half gone
            best = max(best or (0.0, 0, 0, 0), (held, -gens, k, usable))
    if best is None:
        raise ValueError(f"prefix index budget of {max_bytes:.0f} bytes is too small")
    return best[2], best[3], -best[1]
