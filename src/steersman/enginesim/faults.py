"""Fault injection for the simulated engine (CLI flags and ``/admin/faults``).

Later reliability work drives every failure mode through these knobs:

* ``die_after_tokens``: after that many more streamed tokens (over all streams)
  the replica crashes: every connection is reset and the port stops listening.
* ``hang``: the engine stops making progress; connections stay open (a step under way when it lands delivers its
  tokens once the hang is lifted).
* ``slowdown``: every engine step takes this factor longer (a degraded GPU).
* ``error_rate`` / ``error_status``: that share of new requests get a 5xx.
* ``refuse_for_s``: the listener closes for that many seconds (connection refused); open connections (streams in
  flight) go on, and the spec shows 0 again once it listens.
"""

from __future__ import annotations

import asyncio
import random

import msgspec

__all__ = ["FaultSpec", "Faults", "MAX_SLOWDOWN"]

#: the largest ``slowdown``: a 10 ms step then takes ~3 model hours, slow enough for any drill; a larger factor
#: only served to freeze the replica (1e308 made every step's end infinite)
MAX_SLOWDOWN = 1e6


class FaultSpec(msgspec.Struct, forbid_unknown_fields=True):
    die_after_tokens: int | None = None
    hang: bool = False
    slowdown: float = 1.0
    error_rate: float = 0.0
    error_status: int = 500
    refuse_for_s: float = 0.0
    seed: int = 0

    def validate(self) -> None:
        if self.die_after_tokens is not None and self.die_after_tokens < 0:
            raise ValueError("die_after_tokens must be >= 0")
        if not 1.0 <= self.slowdown <= MAX_SLOWDOWN:
            raise ValueError(f"slowdown must be in [1, {MAX_SLOWDOWN:g}], got {self.slowdown!r}")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError("error_rate must be in [0, 1]")
        if not 500 <= self.error_status <= 599:
            raise ValueError("error_status must be a 5xx code")
        if self.refuse_for_s < 0:
            raise ValueError("refuse_for_s must be >= 0")


class Faults:
    """Live fault state of one engine-sim server."""

    def __init__(self, spec: FaultSpec | None = None) -> None:
        self.spec = FaultSpec()
        self._rng = random.Random(0)
        self._tokens_left: int | None = None
        self.unhung = asyncio.Event()
        self.unhung.set()
        self.changed = asyncio.Event()  # set by every apply: wakes a step sleeping under the old slowdown
        self.dead = False
        if spec is not None:
            self.apply(spec)

    def apply(self, spec: FaultSpec) -> None:
        spec.validate()
        self.spec = spec
        self._rng = random.Random(spec.seed)
        self._tokens_left = spec.die_after_tokens
        if spec.hang:
            self.unhung.clear()
        else:
            self.unhung.set()
        self.changed.set()

    @property
    def slowdown(self) -> float:
        return self.spec.slowdown

    @property
    def hung(self) -> bool:
        return not self.unhung.is_set()

    def should_error(self) -> bool:
        rate = self.spec.error_rate
        return rate > 0.0 and self._rng.random() < rate

    def tokens_allowed(self, wanted: int) -> int:
        """How many of ``wanted`` tokens may still be streamed before dying."""
        if self._tokens_left is None:
            return wanted
        return min(wanted, self._tokens_left)

    def streamed(self, n: int) -> bool:
        """Record ``n`` streamed tokens; True when the replica must die now."""
        if self._tokens_left is None:
            return False
        self._tokens_left -= n
        return self._tokens_left <= 0
