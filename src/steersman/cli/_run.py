"""Running an asyncio service from the CLI: uvloop, signals, clean shutdown."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Awaitable, Callable

import uvloop

__all__ = ["run_service"]


def run_service(start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]], *, freeze: bool,
                gc_threshold0: int | None = None) -> None:
    """Start, wait for SIGINT/SIGTERM, then stop; on uvloop.  ``freeze``: once started, move every object
    alive then (imports, kernels, configuration) out of the garbage collector's reach (``gc.freeze``), so
    its full collections walk only what the service allocated since.  ``gc_threshold0``: once started, the
    young generation's collection threshold (``gateway.gc_threshold0``; None keeps Python's)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        try:
            await start()
            if freeze:
                gc.collect()  # what start-up left as garbage is freed, not frozen
                gc.freeze()
            if gc_threshold0 is not None:
                _, g1, g2 = gc.get_threshold()
                gc.set_threshold(gc_threshold0, g1, g2)
            await stopping.wait()
        finally:
            await stop()

    uvloop.run(main())
