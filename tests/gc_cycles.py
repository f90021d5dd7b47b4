"""What the garbage collector finds in reference cycles (for tests that pin a path as cycle-free)."""

import gc
from collections.abc import Callable


def cyclic_garbage(mine: Callable[[object], bool]) -> dict[str, int]:
    """Collect now; the objects found only in reference cycles that ``mine`` accepts, counted by type name."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found: dict[str, int] = {}
        for o in gc.garbage:
            if mine(o):
                found[type(o).__name__] = found.get(type(o).__name__, 0) + 1
        return found
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
