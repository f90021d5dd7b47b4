"""Gateway.stop stops the embedded engine-sims even when an earlier step of it fails (or the gateway never finished
starting): no engine left running behind a gateway that exited."""

from __future__ import annotations

import asyncio

import pytest

from steersman.api.gateway import Gateway
from steersman.fleet.config import parse_fleet, with_gateway


class _Sims:
    stopped = False

    async def stop(self) -> None:
        self.stopped = True


def test_the_sim_fleet_stops_even_when_an_earlier_step_fails():
    async def run():
        gw = Gateway(with_gateway(parse_fleet({"endpoints": [{"url": "http://127.0.0.1:9", "models": ["m"]}]}), port=0))
        gw.sim_fleet = sims = _Sims()

        async def broken() -> None:
            raise RuntimeError("listener close failed")

        gw.http.stop = broken
        with pytest.raises(RuntimeError, match="listener close failed"):
            await gw.stop()
        assert sims.stopped

    asyncio.run(run())


def test_a_gateway_that_never_started_stops_cleanly():
    async def run():
        gw = Gateway(with_gateway(parse_fleet({"endpoints": [{"url": "http://127.0.0.1:9", "models": ["m"]}]}), port=0))
        gw.sim_fleet = sims = _Sims()
        await gw.stop()  # what a Ctrl-C during start-up leads to
        assert sims.stopped

    asyncio.run(run())
