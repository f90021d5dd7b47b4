"""Background passes of :class:`~steersman.fleet.prefix_index.PrefixIndex` (``background=True``).

A mixin (the index sets the attributes used here; see its module doc for what runs where).  One pass at a
time runs on a single worker thread; the caller's thread starts it and finishes it (the pass's ``done``
step, at its next access once the pass is through), so everything but the compiled pass stays on the
caller's thread.

**The GIL.**  A thread waiting for the GIL waits in slices of the switch interval (5 ms), and every release
by the holder restarts the slice: an event loop that releases it every few µs (each syscall, each compiled
kernel) starves the waiter indefinitely (measured: a 100 ms pass took 3.1 s beside such a loop).  So the
worker never waits for the GIL while the loop runs: the pass says through its ``flags`` (written by the
compiled code, without the GIL) that it has started and that it is done, and at those two points the
caller's thread waits for it with the GIL released (sleeping, or in the thread's future) -- for at most
``_HANDSHAKE_S`` an access: on a machine whose cores are busy the worker may wait for one too, and the
loop must not wait with it (it tries again at its next access).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

__all__ = ["BackgroundPasses"]

_POLL_S = 50e-6  # the caller's sleep (the GIL released) while the worker enters the pass
_HANDSHAKE_S = 0.001  # the most one access waits for the worker to enter its pass, or to return from it


class BackgroundPasses:
    """The worker, the pass running, and the records waiting for it."""

    _pool: ThreadPoolExecutor | None
    _job: Future | None
    _job_done: Callable[[np.ndarray], None] | None
    _flags: np.ndarray  # the running pass's: started, done, result (see _start)
    _readable: bool
    _memo: tuple | None
    _later: list[tuple[int, Sequence[int]]]

    def flush(self) -> None:  # pragma: no cover - the index defines it
        raise NotImplementedError

    def _record_now(self, r: int, hashes: Sequence[int]) -> bool:  # pragma: no cover - the index defines it
        raise NotImplementedError

    def _start(self, work: Callable[[np.ndarray], None], done: Callable[[np.ndarray], None], readable: bool) -> None:
        """Run ``work(flags)`` (a compiled pass that writes the flags) on the worker; ``done(flags)`` on this
        thread once it is through."""
        assert self._pool is not None and self._job is None
        flags = np.zeros(3, dtype=np.int64)
        job = self._pool.submit(work, flags)
        self._job, self._job_done, self._flags, self._readable = job, done, flags, readable
        self._memo = None
        self._let_start()

    def _let_start(self) -> None:
        """Sleep (the GIL released, so the worker can take it) until the pass runs, ``_HANDSHAKE_S`` at most."""
        flags, job = self._flags, self._job
        assert job is not None
        end = time.perf_counter() + _HANDSHAKE_S
        while not flags[0] and not job.done() and time.perf_counter() < end:
            time.sleep(_POLL_S)

    def _busy(self) -> bool:
        """A background pass is still running (one that ended is finished here first, on this thread)."""
        job = self._job
        if job is None:
            return False
        flags = self._flags
        if not flags[0] and not job.done():
            self._let_start()
            return True
        if not flags[1] and not job.done():
            return True
        try:  # the pass is over: waiting here (the GIL released) lets its thread return
            job.result(timeout=_HANDSHAKE_S)
        except TimeoutError:
            return True
        self._finish()
        return self._job is not None  # finishing may start the next pass (a trim, a drop)

    def _finish(self) -> None:
        job, done, flags = self._job, self._job_done, self._flags
        assert job is not None and done is not None
        job.result()  # done already (settle waits for it): raises what the pass raised
        self._job = self._job_done = None
        self._readable = True
        self._memo = None
        done(flags)

    def settle(self) -> None:
        """Wait for the background passes and apply every record kept (before a full-table write; tests)."""
        if self._pool is None:
            self.flush()
            return
        while self._job is not None or self._later:
            if self._job is not None:
                self._job.result()
                self._finish()
            self._replay(len(self._later))

    def close(self) -> None:
        """Finish the background work and stop the worker (the gateway's stop)."""
        self.settle()
        if self._pool is not None:
            self._pool.shutdown()

    def _replay(self, most: int) -> None:
        while most > 0 and self._later and not self._busy():
            replica, hashes = self._later[0]
            if self._record_now(replica, hashes):
                return  # a pass had to start first: this record again, whole, after it
            del self._later[0]
            most -= 1

