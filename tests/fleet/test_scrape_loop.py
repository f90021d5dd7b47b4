"""The scrape loop keeps a replica's state coming whatever one scrape or listing does.

* a replica listed without ``models:`` whose ``/v1/models`` fails once while its scrapes succeed is listed again
  (every ``gateway.models_relist_s``, not on every scrape), not left without models and traffic for good;
* a scrape that raises something unexpected is logged (at most every ``gateway.scrape_error_log_every_s``) and the loop goes on.
"""

from __future__ import annotations

import asyncio
import logging

from steersman.config import DEFAULTS
from steersman.engines.base import EngineMetrics, UpstreamError
from steersman.fleet.scraper import Scraper
from steersman.fleet.state import Fleet, Replica
from steersman.testing.clock import FakeClock


class _Engine:
    """Scrapes answer (after ``raise_first`` unexpected errors); the first ``fail_lists`` listings time out."""

    shares_prefill_in_flight = True
    idle_probe = True

    def __init__(self, fail_lists: int = 0, raise_first: int = 0) -> None:
        self.fail_lists = fail_lists
        self.raise_first = raise_first
        self.listed = self.scraped = 0

    async def scrape(self, replica) -> EngineMetrics:
        self.scraped += 1
        if self.scraped <= self.raise_first:
            raise ValueError("could not convert string to float: '4096²'")
        return EngineMetrics(1, 0, 0.0)

    async def list_models(self, replica) -> list[str]:
        self.listed += 1
        if self.listed <= self.fail_lists:
            raise UpstreamError(f"{replica.name} /v1/models took longer than 1.0 s", connected=True)
        return ["llama-3.1-8b"]


def _fleet(engine: _Engine, models: tuple[str, ...] = ()) -> Fleet:
    rep = Replica(0, "r", "http://127.0.0.1:9", "engine-sim", "H100", models, "default", 2.0, 1, adapter=engine)
    return Fleet([rep], FakeClock(start=1.0))


def test_a_failed_listing_is_retried_while_the_scrapes_succeed():
    async def run():
        engine = _Engine(fail_lists=2)
        fleet = _fleet(engine)
        rep, clock = fleet.replicas[0], fleet.clock
        scraper = Scraper(fleet, DEFAULTS.gateway, clock)
        assert await scraper.scrape_once(rep) and engine.listed == 1 and fleet.models() == []
        for _ in range(10):  # not on every scrape
            await clock.advance(DEFAULTS.gateway.models_relist_s / 20)
            assert await scraper.scrape_once(rep)
        assert engine.listed == 1
        await clock.advance(DEFAULTS.gateway.models_relist_s / 2)
        assert await scraper.scrape_once(rep) and engine.listed == 2 and fleet.models() == []  # failed again
        await clock.advance(DEFAULTS.gateway.models_relist_s)
        assert await scraper.scrape_once(rep) and engine.listed == 3
        assert fleet.models() == ["llama-3.1-8b"] and rep.models == ("llama-3.1-8b",)  # was: never listed again
        await clock.advance(DEFAULTS.gateway.models_relist_s * 3)
        assert await scraper.scrape_once(rep) and engine.listed == 3  # listed: never asked again

    asyncio.run(run())


def test_only_the_first_failure_of_a_listing_warns(caplog):
    async def run():
        engine = _Engine(fail_lists=3)
        fleet = _fleet(engine)
        scraper = Scraper(fleet, DEFAULTS.gateway, fleet.clock)
        for _ in range(4):
            await scraper.scrape_once(fleet.replicas[0])
            await fleet.clock.advance(DEFAULTS.gateway.models_relist_s)
        assert engine.listed == 4 and fleet.models() == ["llama-3.1-8b"]

    with caplog.at_level(logging.DEBUG, logger="steersman.scraper"):
        asyncio.run(run())
    said = [r.levelno for r in caplog.records if "cannot list models" in r.getMessage()]
    assert said == [logging.WARNING, logging.DEBUG, logging.DEBUG]


def test_an_unexpected_scrape_error_does_not_end_the_loop(caplog):
    async def run():
        engine = _Engine(raise_first=3)
        fleet = _fleet(engine, models=("llama-3.1-8b",))
        updates = []
        scraper = Scraper(fleet, DEFAULTS.gateway, fleet.clock, on_update=lambda: updates.append(fleet.clock.now()))
        scraper.start()
        try:
            interval = DEFAULTS.gateway.metrics_interval_s
            await fleet.clock.advance(interval * 5.5)  # scrapes 1-3 raise, 4-6 answer
            assert engine.scraped == 6 and len(updates) == 3  # was: the loop ended at the first error
            assert all(not t.done() for t in scraper._tasks)
            await fleet.clock.advance(DEFAULTS.gateway.scrape_error_log_every_s)
            engine.raise_first = engine.scraped + 2  # two more errors a minute later: one more log
            await fleet.clock.advance(interval * 3)
            assert engine.scraped > engine.raise_first
        finally:
            await scraper.stop()

    with caplog.at_level(logging.ERROR, logger="steersman.scraper"):
        asyncio.run(run())
    logged = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert len(logged) == 2 and all(r.exc_info[0] is ValueError for r in logged)  # 5 errors, one log a minute


class _Dying(_Engine):
    """Scrapes fail while ``down``."""

    down = False

    async def scrape(self, replica) -> EngineMetrics:
        if self.down:
            raise UpstreamError(f"{replica.name}: connection refused", connected=False)
        return EngineMetrics(1, 0, 0.0)


def test_a_restart_a_request_found_first_lifts_the_ejection_through_the_scraper():
    """A review: a request's failed connection marks the replica unhealthy first (passively), the scraper then
    skipped its own verdict (already unhealthy), so the guard never saw the checks fail and a restarted replica
    sat out its whole ejection live, where the twin lifted it."""
    from steersman.reliability import ReplicaGuard

    async def run():
        engine = _Dying()
        fleet = _fleet(engine, ("llama-3.1-8b",))
        fleet.guard = ReplicaGuard(1, DEFAULTS.reliability, 0.2)
        rep, clock = fleet.replicas[0], fleet.clock
        scraper = Scraper(fleet, DEFAULTS.gateway, clock)
        assert fleet.guard.outliers.eject(0, clock.now(), "5 consecutive failures")
        engine.down = True
        fleet.set_healthy(0, False, active=False)  # a request's connection refused
        for _ in range(DEFAULTS.gateway.unhealthy_after_failures + 2):
            assert not await scraper.scrape_once(rep)
            await clock.advance(DEFAULTS.gateway.metrics_interval_s)
        await clock.advance(DEFAULTS.reliability.restart_down_s)  # the engine restarts
        engine.down = False
        assert await scraper.scrape_once(rep) and fleet.healthy[0]
        assert not fleet.guard.outliers.is_ejected(0, clock.now())

    asyncio.run(run())
