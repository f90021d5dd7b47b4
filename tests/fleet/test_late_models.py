"""A replica listed without ``models:`` whose engine is down when the gateway starts gets its models once the engine
is up: the first good scrape after failed ones lists them again (once, not on every scrape)."""

from __future__ import annotations

import asyncio

from steersman.config import DEFAULTS
from steersman.engines.base import EngineMetrics, UpstreamError
from steersman.fleet.scraper import Scraper, discover_models
from steersman.fleet.state import Fleet, Replica
from steersman.testing.clock import FakeClock


class _Engine:
    """An adapter whose engine is down (every call refused) until ``up``; ``models`` is what it lists."""

    shares_prefill_in_flight = True
    idle_probe = True

    def __init__(self, models: list[str]) -> None:
        self.up = False
        self.models = models
        self.listed = 0

    async def scrape(self, replica) -> EngineMetrics:
        if not self.up:
            raise UpstreamError(f"{replica.name} refused", connected=False)
        return EngineMetrics(0, 0, 0.0)

    async def list_models(self, replica) -> list[str]:
        self.listed += 1
        if not self.up:
            raise UpstreamError(f"{replica.name} refused", connected=False)
        return list(self.models)


def _fleet(engine: _Engine) -> Fleet:
    rep = Replica(0, "late", "http://127.0.0.1:9", "engine-sim", "H100", (), "default", 2.0, 1, adapter=engine)
    return Fleet([rep], FakeClock(start=1.0))


def test_an_engine_down_at_start_gets_its_models_once_it_is_up():
    async def run():
        engine = _Engine(["llama-3.1-8b"])
        fleet = _fleet(engine)
        rep = fleet.replicas[0]
        assert not await discover_models(fleet, rep)  # what the gateway's start does: the engine is down
        scraper = Scraper(fleet, DEFAULTS.gateway, fleet.clock)
        for _ in range(DEFAULTS.gateway.unhealthy_after_failures):
            assert not await scraper.scrape_once(rep)
        assert not fleet.healthy[0] and fleet.models() == []
        engine.up = True
        assert await scraper.scrape_once(rep)
        assert fleet.healthy[0] and fleet.models() == ["llama-3.1-8b"] and fleet.has_model("llama-3.1-8b")
        assert rep.models == ("llama-3.1-8b",)

    asyncio.run(run())


def test_an_engine_that_lists_nothing_is_asked_again_only_after_it_failed():
    async def run():
        engine = _Engine([])
        engine.up = True
        fleet = _fleet(engine)
        rep = fleet.replicas[0]
        scraper = Scraper(fleet, DEFAULTS.gateway, fleet.clock)
        for _ in range(5):
            assert await scraper.scrape_once(rep)
        assert engine.listed == 1 and fleet.models() == []  # once, not on every scrape
        engine.up = False
        assert not await scraper.scrape_once(rep)
        engine.up, engine.models = True, ["m"]
        assert await scraper.scrape_once(rep)
        assert engine.listed == 2 and fleet.models() == ["m"]
        await scraper.scrape_once(rep)
        assert engine.listed == 2

    asyncio.run(run())
