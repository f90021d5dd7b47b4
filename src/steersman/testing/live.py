"""A live fleet on 127.0.0.1 for tests: engine-sim / scripted engines plus a gateway.

Everything runs on its own event loop in a background thread, so a test can use
blocking clients (``openai.OpenAI``, ``httpx``) against real sockets.  Use
:meth:`LiveFleet.call` to run a coroutine on that loop (e.g. to inspect or
fault an engine).
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import uvloop

from steersman.api.gateway import Gateway
from steersman.enginesim.app import SimServer, SimServerConfig
from steersman.fleet.config import parse_fleet
from steersman.testing.scripted import Script, ScriptedEngine

__all__ = ["LiveFleet"]

T = TypeVar("T")

_frozen = 0  # live fleets open that froze the heap (gc.freeze is process-wide: the last to close unfreezes)
_frozen_lock = threading.Lock()


class LiveFleet:
    def __init__(
        self,
        sims: Sequence[SimServerConfig] = (),
        scripted: Sequence[Script] = (),
        policy: str = "steersman",
        gateway: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        with_gateway: bool = True,
        endpoints: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.sim_configs = list(sims)
        self.scripts = list(scripted)
        self.policy = policy
        self.gateway_overrides = {"port": 0, **(gateway or {})}
        self.with_gateway = with_gateway
        self.extra_endpoints = list(endpoints)  # engines running elsewhere (fleet-file endpoint entries)
        self.extra = dict(extra or {})  # more fleet-file sections: scheduler, admission, tenants, api_keys
        self.sims: list[SimServer] = []
        self.scripted: list[ScriptedEngine] = []
        self.gateway: Gateway | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._froze = False

    # ---- thread plumbing ---------------------------------------------------
    def __enter__(self) -> LiveFleet:
        ready = threading.Event()

        def run() -> None:
            self._loop = uvloop.new_event_loop()
            asyncio.set_event_loop(self._loop)
            ready.set()
            self._loop.run_forever()
            self._loop.close()

        self._thread = threading.Thread(target=run, name="live-fleet", daemon=True)
        self._thread.start()
        ready.wait()
        try:
            self.call(self._start)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self._freeze()
        return self

    def _freeze(self) -> None:
        """The gateway process's policy (``gateway.gc_freeze``, :func:`steersman.cli._run.run_service`): once
        started, what is alive leaves the collector's full passes.  Here the process is the test run's, whose heap
        (every module imported, earlier tests' objects) made a full collection stall every stream for ~130 ms on
        a slow 2-core machine: a latency drill's p99 read that stall, not the gateway (tests/faults/test_hang.py)."""
        global _frozen
        settings = self.gateway.settings if self.gateway is not None else None
        if settings is not None and not settings.gc_freeze:
            return
        with _frozen_lock:
            gc.collect()  # garbage is freed, not frozen
            gc.freeze()
            _frozen += 1
        self._froze = True

    def _unfreeze(self) -> None:
        global _frozen
        if not self._froze:
            return
        self._froze = False
        with _frozen_lock:
            _frozen -= 1
            if not _frozen:
                gc.unfreeze()

    def __exit__(self, *exc: object) -> None:
        if self._loop is None:
            return
        self._unfreeze()
        try:
            self.call(self._stop)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(10)
            self._loop = None

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float = 60.0) -> T:
        """Run ``fn(*args)`` on the fleet's loop and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(fn(*args), self._loop).result(timeout)

    # ---- lifecycle ---------------------------------------------------------
    async def _start(self) -> None:
        endpoints = []
        for i, cfg in enumerate(self.sim_configs):
            s = SimServer(cfg if cfg.port == 0 else _port0(cfg))
            await s.start()
            self.sims.append(s)
            endpoints.append({"name": f"sim-{i}", "url": s.url, "engine": "engine-sim", "gpu": cfg.gpu, "models": [s.model_name], "tp": cfg.engine.tensor_parallel,
                              "scheduling": cfg.engine.scheduling_policy, "lora_modules": list(cfg.lora_modules)})
            if s.kv_events is not None:
                endpoints[-1].update(kv_events=s.kv_events.endpoint, kv_events_topic=cfg.kv_events_topic,
                                     kv_events_replay=s.kv_events.replay_endpoint)
        for i, script in enumerate(self.scripts):
            e = ScriptedEngine(script)
            await e.start()
            self.scripted.append(e)
            endpoints.append({"name": f"scripted-{i}", "url": e.url, "engine": "openai", "models": [script.model],
                              "scheduling": script.scheduling})
        endpoints += self.extra_endpoints
        if self.with_gateway:
            cfg = parse_fleet({"gateway": self.gateway_overrides, "policy": self.policy, "endpoints": endpoints, **self.extra}, "LiveFleet")
            self.gateway = Gateway(cfg)
            await self.gateway.start()

    async def _stop(self) -> None:
        if self.gateway is not None:
            await self.gateway.stop()
        for s in self.sims:
            await s.stop()
        for e in self.scripted:
            await e.stop()

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url


def _port0(cfg: SimServerConfig) -> SimServerConfig:
    from dataclasses import replace

    return replace(cfg, port=0)
