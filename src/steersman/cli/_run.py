"""Running an asyncio service from the CLI: uvloop, signals, clean shutdown."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Awaitable, Callable

import uvloop

__all__ = ["run_service"]


def run_service(start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]], *, freeze: bool) -> None:
    """Start, wait for SIGINT/SIGTERM, then stop; on uvloop.  ``freeze``: once started, move every object
    alive then (imports, kernels, configuration) out of the garbage collector's reach (``gc.freeze``), so
    its full collections walk only what the service allocated since."""

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
            await stopping.wait()
        finally:
            await stop()

    uvloop.run(main())
