"""The twin's garbage-collector tuning while its event loop runs (:attr:`TwinConfig.tune_gc
<steersman.twin.core.TwinConfig.tune_gc>`)."""

from __future__ import annotations

import gc

from steersman.config import DEFAULTS

__all__ = ["GcTuned"]


class GcTuned:
    """Fewer collections while the event loop runs: the heap that exists at the start (fleet, workload,
    index) is frozen out of collection and the thresholds raised (``DEFAULTS.twin``); both restored after.
    Results do not depend on it (``tests/twin/test_determinism.py``); only speed does."""

    def __enter__(self) -> None:
        self._thresholds = gc.get_threshold()
        self._froze = gc.get_freeze_count() == 0  # someone else's frozen heap stays theirs to unfreeze
        if self._froze:
            gc.collect()
            gc.freeze()
        t = DEFAULTS.twin
        gc.set_threshold(t.gc_threshold0, t.gc_threshold1, t.gc_threshold2)

    def __exit__(self, *exc) -> None:
        gc.set_threshold(*self._thresholds)
        if self._froze:
            gc.unfreeze()
