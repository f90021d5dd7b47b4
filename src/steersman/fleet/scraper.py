"""Polls every replica's ``/metrics`` into the fleet state (the IO edge of observability).

A replica whose scrapes fail ``unhealthy_after_failures`` times in a row is
marked unhealthy; one good scrape marks it healthy again.

A replica the fleet file lists without ``models:`` serves what its ``/v1/models`` says
(:func:`discover_models`, at start).  One whose engine was down then gets no traffic until
they are known, so the first good scrape after failed ones lists them again: once per
recovery, not every scrape (an engine without ``/v1/models`` is not asked 20 times a second).
A listing that fails while the scrapes succeed (a timeout, a 503 in a restart) is asked again
every ``gateway.models_relist_s`` until it answers.

A scrape that raises something unexpected (a bug reading an odd page) is logged, at most every
``gateway.scrape_error_log_every_s`` per replica, and the replica's loop goes on: it never ends a scrape loop.
"""

from __future__ import annotations

import asyncio
import logging
import math

from steersman.clock import Clock
from steersman.config import GatewaySettings
from steersman.engines.base import UpstreamError
from steersman.fleet.state import Fleet, Replica

__all__ = ["Scraper", "discover_models"]

log = logging.getLogger("steersman.scraper")


async def discover_models(fleet: Fleet, rep: Replica, quiet: bool = False) -> bool:
    """Set ``rep``'s models from its engine's ``/v1/models``; False (logged; ``quiet``: at debug level, for a
    retry of a failure already logged) when it cannot say."""
    try:
        models = await rep.adapter.list_models(rep.address)
    except UpstreamError as e:
        log.log(logging.DEBUG if quiet else logging.WARNING,
                "cannot list models of %s (%s); it gets no traffic until they are listed", rep.name, e)
        return False
    loras = getattr(models, "loras", ())  # (a steersman.engines.base.ModelList says which are LoRA adapters)
    fleet.set_models(rep.index, models, loras)
    if models:
        log.info("replica %s serves %s", rep.name, ", ".join(models) + (
            f" (LoRA adapters: {', '.join(loras)})" if loras else ""))
    mixed = sorted(m for r in fleet.replicas for m in r.models if m in fleet.lora_keys and m not in r.loras)
    if mixed:  # keyed everywhere (Fleet.lora_keys): the replicas serving it as a base model get no prefix credit
        log.warning("%s is a LoRA adapter on one replica and a base model on another: its prompts are keyed as the "
                    "adapter's everywhere (give the names apart)", ", ".join(dict.fromkeys(mixed)))
    return True


class Scraper:
    def __init__(self, fleet: Fleet, settings: GatewaySettings, clock: Clock, on_update=None) -> None:
        self.fleet = fleet
        self.on_update = on_update  # called after every successful scrape (capacity may have freed)
        self.settings = settings
        self.clock = clock
        self._tasks: list[asyncio.Task] = []
        self._failures = [0] * len(fleet.replicas)
        #: replicas without models whose good scrapes list them (again): the earliest time to (-inf: the next
        #: good scrape; a failed listing: gateway.models_relist_s later)
        self._unlisted = {r.index: -math.inf for r in fleet.replicas if not r.models}
        self._logged = [-math.inf] * len(fleet.replicas)  # when each replica's last unexpected error was logged

    async def scrape_once(self, rep: Replica) -> bool:
        try:
            m = await rep.adapter.scrape(rep.address)
        except UpstreamError as e:
            self._failures[rep.index] += 1
            n, after = self._failures[rep.index], self.settings.unhealthy_after_failures
            # the checks' own verdict, once a streak, also when a failed connection marked it first (passively):
            # a restart is told by failed checks then good ones (ReplicaGuard.health; a review found a replica a
            # request found dead first kept its ejection after its restart, live, where the twin lifted it)
            if n >= after and (self.fleet.healthy[rep.index] or n == after):
                if self.fleet.healthy[rep.index]:
                    log.warning("replica %s unhealthy: %s", rep.name, e)
                self.fleet.set_healthy(rep.index, False)
            if not rep.models:
                self._unlisted[rep.index] = -math.inf  # listed at the recovery, whatever failed before
            return False
        self._failures[rep.index] = 0
        self.fleet.update_metrics(rep.index, m)
        if not self.fleet.healthy[rep.index]:
            log.info("replica %s healthy again", rep.name)
            self.fleet.set_healthy(rep.index, True)
        at = self._unlisted.get(rep.index)
        if at is not None and self.clock.now() >= at:
            await self._list(rep, at)
        if self.on_update is not None:
            self.on_update()
        return True

    async def _list(self, rep: Replica, at: float) -> None:
        if rep.models or await discover_models(self.fleet, rep, quiet=at != -math.inf):
            del self._unlisted[rep.index]
        else:
            self._unlisted[rep.index] = self.clock.now() + self.settings.models_relist_s

    async def _loop(self, rep: Replica) -> None:
        interval = self.settings.metrics_interval_s
        while True:
            try:
                await self.scrape_once(rep)
            except Exception:  # a bug must not end the replica's scrapes (cancellation is no Exception)
                self._unexpected(rep)
            await self.clock.sleep(interval)

    def _unexpected(self, rep: Replica) -> None:
        now = self.clock.now()
        if now - self._logged[rep.index] >= self.settings.scrape_error_log_every_s:
            self._logged[rep.index] = now
            log.exception("scraping replica %s failed unexpectedly (logged at most every %g s)", rep.name, self.settings.scrape_error_log_every_s)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._loop(r), name=f"scrape-{r.name}") for r in self.fleet.replicas]

    async def stop(self) -> None:
        # cancel until they end: on Python 3.11 a wait_for (connect, scrape timeout) whose inner call finishes
        # just as the cancel arrives swallows it (gh-86296), and the loop would go on scraping forever
        pending = set(self._tasks)
        for _ in range(50):
            if not pending:
                break
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.1)
        self._tasks = []
