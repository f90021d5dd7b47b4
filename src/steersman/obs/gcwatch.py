"""The garbage collector's pauses in this process, for the gateway's ``/metrics``.

A collection stops the event loop, so every stream in flight stalls for its length: the
gateway's inter-token latency and TTFT tails carry it.  ``steersman:gc_pause_seconds``
(per generation) makes those stalls visible next to the latencies they cause.  A
served request is meant to leave no reference cycle behind (see
``tests/gateway/test_no_garbage.py``); a rising count of generation-2 pauses says
something does again.

Pauses are process facts measured on the process's own timer (like the plugin latency
histograms), not control-plane time: nothing decides on them.
"""

from __future__ import annotations

import gc
import time

from steersman.obs.histogram import HistogramFamily

__all__ = ["GcPauses", "GC_BUCKETS"]

#: young collections take ~10 µs to ~1 ms here, a full one over a large heap tens of ms
GC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class GcPauses:
    """Times each collection through ``gc.callbacks`` while installed."""

    def __init__(self, family: HistogramFamily) -> None:
        self._hist = tuple(family.labels(str(g)) for g in range(3))
        self._t0: float | None = None

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self._hist[min(info["generation"], 2)].observe(time.perf_counter() - self._t0)
            self._t0 = None
