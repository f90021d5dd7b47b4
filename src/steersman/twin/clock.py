"""The twin's virtual clock: time moves only when the event loop says so."""

from __future__ import annotations

__all__ = ["VirtualClock"]


class VirtualClock:
    """Implements :class:`steersman.clock.Clock` for code that only reads the time.

    The twin is event-driven: nothing in it sleeps, so :meth:`sleep` is refused
    (a component that needs to wait must be given an event instead).
    """

    __slots__ = ("t", "epoch")

    def __init__(self, start: float = 0.0, epoch: float = 1_700_000_000.0) -> None:
        self.t = float(start)
        self.epoch = epoch

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.epoch + self.t

    async def sleep(self, seconds: float) -> None:
        raise RuntimeError("the digital twin is event-driven: schedule an event instead of sleeping")
