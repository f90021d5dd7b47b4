"""Running an asyncio service from the CLI: uvloop, signals, clean shutdown."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

import uvloop

__all__ = ["run_service"]


def run_service(start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]) -> None:
    """Start, wait for SIGINT/SIGTERM, then stop; on uvloop."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        try:
            await start()
            await stopping.wait()
        finally:
            await stop()

    uvloop.run(main())
