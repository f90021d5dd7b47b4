"""Running an asyncio service from the CLI: uvloop, signals, clean shutdown."""

from __future__ import annotations

import asyncio
import errno
import gc
import signal
from collections.abc import Awaitable, Callable

import uvloop

__all__ = ["run_service", "exit_if_cannot_listen"]


def run_service(start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]], *, freeze: bool,
                gc_threshold0: int | None = None, drain: Callable[[], Awaitable[None]] | None = None) -> None:
    """Start, wait for SIGINT/SIGTERM/SIGHUP, then stop; on uvloop.  A signal while starting cancels the start (then
    stops, at once).  ``drain``: once started, the first signal runs it (a graceful shutdown: the work in flight
    finishes) before ``stop``; a second signal cuts it short.  ``freeze``: once started, move every object alive then (imports, kernels, configuration)
    out of the garbage collector's reach (``gc.freeze``), so its full collections walk only what the service
    allocated since.  ``gc_threshold0``: once started, the young generation's collection threshold
    (``gateway.gc_threshold0``; None keeps Python's)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        # a task, so that a signal during a slow start (engines loading, kernels compiling) cuts it short:
        # what start() began cleans up on the cancellation, stop() the rest
        starting = asyncio.ensure_future(start())
        draining: asyncio.Future | None = None
        signals = 0  # the second cuts the drain short (also when both came before the drain began)
        cut = False

        def on_signal() -> None:
            nonlocal signals, cut
            signals += 1
            if signals >= 2 and draining is not None and not draining.done():
                cut = True
                draining.cancel()  # the second signal: stop now
            stopping.set()
            starting.cancel()  # nothing once started

        # SIGHUP: the terminal closed (its session's processes get it; the engines steersman starts are in their own)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, on_signal)
        try:
            try:
                await starting
            except asyncio.CancelledError:
                if not stopping.is_set():
                    raise  # not ours: main() itself was cancelled
                return
            if freeze:
                gc.collect()  # what start-up left as garbage is freed, not frozen
                gc.freeze()
            if gc_threshold0 is not None:
                _, g1, g2 = gc.get_threshold()
                gc.set_threshold(gc_threshold0, g1, g2)
            await stopping.wait()
            if drain is not None and signals < 2:
                draining = asyncio.ensure_future(drain())
                try:
                    await draining
                except asyncio.CancelledError:
                    if not cut:
                        raise  # not ours: main() itself was cancelled
        finally:
            await stop()

    uvloop.run(main())


_LISTEN_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})


def exit_if_cannot_listen(command: str, e: BaseException) -> None:
    """A service that could not open its listening socket (port taken, address not local, no permission, a host
    name that does not resolve): say so and exit with status 2, no traceback.  Anything else returns, for the
    caller to re-raise."""
    import socket

    if isinstance(e, socket.gaierror):  # getaddrinfo's own error numbers (EAI_*), not errno's
        import typer

        typer.echo(f"{command}: cannot listen: the host does not resolve to an address ({e.strerror})", err=True)
        raise typer.Exit(2) from None
    if isinstance(e, OSError) and e.errno in _LISTEN_ERRNOS:
        import typer

        typer.echo(f"{command}: cannot listen: {e.strerror}", err=True)
        raise typer.Exit(2) from None
