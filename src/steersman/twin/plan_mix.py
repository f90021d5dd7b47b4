"""Mixed fleets for ``steersman plan``: which two-type fleets may beat the cheapest single-type one.

Pure arithmetic over what the single-type searches found: for each GPU type, the smallest
replica count ``n`` that met the SLO at the stressed load (so ``n - 1`` did not).  Assuming
capacity adds up linearly across replicas (the planner's stated assumption), one replica of
that type carries a share of the load in ``[1/n, 1/(n-1))``:

* **candidates** for simulation are fleets of ``a`` replicas of one type and ``b`` of another
  that are cheaper than the best fleet found so far and *could* cover the load with the
  upper bounds (``a/(n_A-1) + b/(n_B-1) > 1``; a type that met with one replica has no
  upper bound).  The gain of mixing is the rounding of single-type counts: 7.3 replicas'
  worth of A100s costs 8 of them, or 7 and a small GPU for the rest.
* **covers** for the hours of a daily curve use the lower bounds (``a/n_A + b/n_B >= share``,
  the share of the peak load that hour): conservative, and the single-type answer of the
  old planner (``ceil(share x n)``) whenever no mix is cheaper.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import permutations

__all__ = ["TypeFit", "Fleet", "candidates", "cover", "fleet_cost", "label"]

#: (GPU name, replicas) per type; a fleet lists its types by replicas, most first
Fleet = tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class TypeFit:
    """What the single-type search found for one GPU type."""

    name: str  # the GPU profile's name (the fleet files' ``gpu:``)
    n: int  # the smallest replica count that met the SLO
    price: float  # $/hour of one replica (GPU price x tensor-parallel degree)


def fleet_cost(fleet: Fleet, fits: Sequence[TypeFit]) -> float:
    price = {f.name: f.price for f in fits}
    return sum(price[g] * k for g, k in fleet)


def label(fleet: Fleet) -> str:
    return " + ".join(f"{k} x {g}" for g, k in fleet)


def _fleet(*parts: tuple[str, int]) -> Fleet:
    return tuple(sorted(((g, k) for g, k in parts if k > 0), key=lambda p: (-p[1], p[0])))


def candidates(fits: Sequence[TypeFit], below: float) -> list[Fleet]:
    """Two-type fleets cheaper than ``below`` $/h whose optimistic capacity covers the load, cheapest first
    (ties: the one whose pessimistic capacity covers more first)."""
    found: dict[Fleet, tuple[float, float]] = {}
    for big, small in permutations(fits, 2):
        for a in range(1, big.n):
            if a * big.price + small.price >= below:
                break
            rest = 1.0 - a / (big.n - 1)  # the share the small type must carry, at its best
            b = 1 if rest < 0 or small.n == 1 else max(1, math.floor(rest * (small.n - 1)) + 1)
            while b < small.n and a * big.price + b * small.price < below:
                fl = _fleet((big.name, a), (small.name, b))
                found[fl] = (a * big.price + b * small.price, -(a / big.n + b / small.n))
                b += 1
    return sorted(found, key=lambda fl: found[fl])


def cover(fits: Sequence[TypeFit], share: float) -> tuple[Fleet, float]:
    """The cheapest fleet of one or two types whose pessimistic capacity covers ``share`` of the peak load."""
    best: tuple[Fleet, float] | None = None
    for f in fits:
        k = max(1, math.ceil(share * f.n - 1e-9))
        c = k * f.price
        if best is None or c < best[1] - 1e-12:
            best = (_fleet((f.name, k)), c)
    for big, small in permutations(fits, 2):
        for a in range(1, math.ceil(share * big.n - 1e-9)):
            b = math.ceil((share - a / big.n) * small.n - 1e-9)
            c = a * big.price + b * small.price
            if best is None or c < best[1] - 1e-12:
                best = (_fleet((big.name, a), (small.name, b)), c)
    assert best is not None, "cover() needs at least one GPU type"
    return best
