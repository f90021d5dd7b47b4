"""A sleeping vLLM replica reads as cold weights (the scheduler's warmth axis: not routable).

vLLM's sleep mode (``--enable-sleep-mode``; ``POST /sleep?level=1|2`` offloads or discards the weights and frees the
KV cache, ``POST /wake_up`` brings them back) leaves ``/health`` and ``/metrics`` answering, so a sleeping replica
looked warm and requests routed there waited for a wake-up or failed.  Two signals, as vLLM gives them:

* ``vllm:engine_sleep_state`` (``vllm/v1/metrics/loggers.py``, vLLM PR #24176, outside dev mode since #27867): a
  one-hot gauge per engine labelled ``sleep_state`` = ``awake`` | ``weights_offloaded`` (level 1) | ``discard_all``
  (level 2), on the page the gateway scrapes anyway (``tests/engines/data/vllm_metrics_recorded.txt`` has it);
* ``GET /is_sleeping`` -> ``{"is_sleeping": bool}`` for a vLLM whose page lacks the gauge (older versions; the
  route exists only with ``VLLM_SERVER_DEV_MODE=1``): asked at most every second, and where it is absent (404, or an
  answer that is not vLLM's) again only a minute later, not at every 50 ms scrape.

engine-sim imitates both (with ``sleep_mode``, vLLM's ``--enable-sleep-mode`` in dev mode), so a scrape over real HTTP
sees the replica go cold and come back.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import orjson

from steersman.api.errors import error_body
from steersman.clock import ScaledClock
from steersman.enginesim.app import SimServer, SimServerConfig
from steersman.engines import OpenAIHttpAdapter
from steersman.engines.base import ReplicaAddress
from steersman.engines.metric_names import METRIC_NAMES
from steersman.engines.openai_http import parse_metrics
from steersman.http.server import HttpRequest, HttpServer

DATA = Path(__file__).parent / "data"
RECORDED = (DATA / "vllm_metrics_recorded.txt").read_text()  # vLLM awake: awake 1, weights_offloaded 0, discard_all 0


def _asleep(page: str, level: int) -> str:
    """The recorded page as vLLM renders it after ``POST /sleep?level=<level>`` (record_sleep_state(1, level))."""
    state = "weights_offloaded" if level == 1 else "discard_all"
    page = page.replace('sleep_state="awake"} 1.0', 'sleep_state="awake"} 0.0')
    return page.replace(f'sleep_state="{state}"}} 0.0', f'sleep_state="{state}"}} 1.0')


def test_a_sleeping_vllm_reads_cold_at_either_level():
    names = METRIC_NAMES["vllm"]
    assert parse_metrics(RECORDED, names).weights == "warm"  # was None: the page's state unread
    for level in (1, 2):
        page = _asleep(RECORDED, level)
        assert page != RECORDED
        assert parse_metrics(page, names).weights == "cold"  # was None: routed to as warm


def test_the_sleep_gauge_is_in_the_filtered_scrape():
    for kind in ("vllm", "engine-sim", "openai"):
        assert "vllm:engine_sleep_state" in METRIC_NAMES[kind].scraped()
    assert "vllm:engine_sleep_state" not in METRIC_NAMES["sglang"].scraped()


def test_one_sleeping_data_parallel_engine_makes_the_replica_cold():
    page = ''.join(f'vllm:engine_sleep_state{{engine="{e}",model_name="m",sleep_state="{s}"}} {v}\n'
                   for e, states in (("0", (1.0, 0.0, 0.0)), ("1", (0.0, 1.0, 0.0)))
                   for s, v in zip(("awake", "weights_offloaded", "discard_all"), states))
    assert parse_metrics(page, METRIC_NAMES["vllm"]).weights == "cold"
    awake = page.replace('engine="1",model_name="m",sleep_state="awake"} 0.0',
                         'engine="1",model_name="m",sleep_state="awake"} 1.0').replace(
                         'sleep_state="weights_offloaded"} 1.0', 'sleep_state="weights_offloaded"} 0.0')
    assert parse_metrics(awake, METRIC_NAMES["vllm"]).weights == "warm"


def test_sleep_wins_over_the_sims_weights_gauge():
    sim = ('steersman_sim:weights_state{engine="0",state="cold"} 0.0\n'
           'steersman_sim:weights_state{engine="0",state="loading"} 1.0\n'
           'steersman_sim:weights_state{engine="0",state="warm"} 0.0\n')
    awake = 'vllm:engine_sleep_state{engine="0",sleep_state="awake"} 1.0\n'
    asleep = 'vllm:engine_sleep_state{engine="0",sleep_state="awake"} 0.0\n'
    names = METRIC_NAMES["engine-sim"]
    assert parse_metrics(sim + awake, names).weights == "loading"  # awake, weights still coming back
    assert parse_metrics(sim + asleep, names).weights == "cold"
    assert parse_metrics("vllm:num_requests_running 0\n", names).weights is None  # the page does not say


def test_the_fleet_stops_routing_to_a_sleeping_replica_and_takes_it_back_awake():
    from steersman.fleet.state import Fleet, Replica
    from steersman.testing import FakeClock

    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "vllm", "H100", ("gemma-3-270m",), "p", 1.0, 1, None)
            for i in range(2)]
    fleet = Fleet(reps, FakeClock())
    names = METRIC_NAMES["vllm"]
    fleet.update_metrics(0, parse_metrics(RECORDED, names))
    fleet.update_metrics(1, parse_metrics(RECORDED, names))
    assert list(fleet.snapshot().candidates("gemma-3-270m")) == [0, 1]
    fleet.update_metrics(1, parse_metrics(_asleep(RECORDED, 1), names))
    assert list(fleet.snapshot().candidates("gemma-3-270m")) == [0]  # was [0, 1]: the sleeper looked warm
    fleet.update_metrics(1, parse_metrics(RECORDED, names))
    assert list(fleet.snapshot().candidates("gemma-3-270m")) == [0, 1]


# ---- over HTTP: engine-sim --------------------------------------------------------------------------------------

def test_engine_sim_sleeps_and_wakes_like_vllm_and_the_scrape_follows():
    async def go():
        srv = SimServer(SimServerConfig(port=0, sleep_mode=True), clock=ScaledClock(1000.0))
        await srv.start()
        adapter = OpenAIHttpAdapter("vllm")  # a real vLLM's names: the sleep gauge decides, not the sim's own
        rep = ReplicaAddress("sim", srv.url)
        try:
            async with httpx.AsyncClient(base_url=srv.url) as c:
                assert (await adapter.scrape(rep)).weights == "warm"
                assert (await c.get("/is_sleeping")).json() == {"is_sleeping": False}
                assert (await c.post("/sleep", params={"level": "2"})).status_code == 200
                assert (await c.get("/is_sleeping")).json() == {"is_sleeping": True}
                page = (await c.get("/metrics")).text
                assert 'vllm:engine_sleep_state{engine="0",model_name="llama-3.1-8b",sleep_state="awake"} 0.0' in page
                assert 'sleep_state="discard_all"} 1.0' in page and 'sleep_state="weights_offloaded"} 0.0' in page
                assert (await adapter.scrape(rep)).weights == "cold"
                # a request sent to the sleeper waits for the wake-up (as it did when routed there as warm)
                waiting = asyncio.ensure_future(c.post("/v1/completions", json={
                    "model": "llama-3.1-8b", "prompt": "hello", "max_tokens": 2, "ignore_eos": True}))
                await asyncio.sleep(0.2)  # 200 s of model time: far more than the load takes
                assert not waiting.done()
                assert (await c.post("/wake_up")).status_code == 200
                assert (await c.get("/is_sleeping")).json() == {"is_sleeping": False}
                for _ in range(200):  # weights reload (engine-sim's load model, 1000x real time)
                    m = await adapter.scrape(rep)
                    if m.weights == "warm":
                        break
                    assert m.weights in ("cold", "loading")
                    await asyncio.sleep(0.01)
                assert m.weights == "warm"
                assert (await waiting).json()["usage"]["completion_tokens"] == 2
                r = await c.post("/v1/completions", json={"model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 3,
                                                         "ignore_eos": True})
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        finally:
            await adapter.close()
            await srv.stop()

    asyncio.run(go())


def test_engine_sim_without_sleep_mode_has_no_sleep_routes_but_the_gauge():
    async def go():
        srv = SimServer(SimServerConfig(port=0), clock=ScaledClock(1000.0))
        await srv.start()
        try:
            async with httpx.AsyncClient(base_url=srv.url) as c:
                assert (await c.post("/sleep")).status_code == 404  # vLLM registers them in dev mode only
                assert (await c.get("/is_sleeping")).status_code == 404
                assert 'sleep_state="awake"} 1.0' in (await c.get("/metrics")).text
        finally:
            await srv.stop()

    asyncio.run(go())


# ---- over HTTP: a vLLM without the gauge (GET /is_sleeping) -----------------------------------------------------

OLD_PAGE = b'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'  # no vllm:engine_sleep_state


class _OldVllm:
    """A vLLM page without the sleep gauge; ``/is_sleeping`` answers ``sleeping`` (None: no such route, 404)."""

    def __init__(self, sleeping: bool | None, page: bytes = OLD_PAGE) -> None:
        self.sleeping = sleeping
        self.page = page
        self.asked: list[str] = []
        self.http = HttpServer(error_body, 1 << 20)
        self.http.route("GET", "/metrics", self._metrics)
        self.http.route("GET", "/is_sleeping", self._is_sleeping)

    async def _metrics(self, request: HttpRequest) -> None:
        self.asked.append("/metrics")
        request.respond(200, self.page, b"text/plain")

    async def _is_sleeping(self, request: HttpRequest) -> None:
        self.asked.append("/is_sleeping")
        if self.sleeping is None:
            request.respond(404, b'{"detail":"Not Found"}')
        else:
            request.respond(200, orjson.dumps({"is_sleeping": self.sleeping}))


def _scrapes(engine: _OldVllm, times: list[float], flip: dict[int, bool | None] | None = None) -> list[str | None]:
    """Scrape ``engine`` at each clock time of ``times``; ``flip``: before scrape i, set its sleep answer."""
    async def go():
        port = await engine.http.start("127.0.0.1", 0)
        clock = iter(times)
        now = [0.0]
        adapter = OpenAIHttpAdapter("vllm", now=lambda: now[0])
        rep = ReplicaAddress("old", f"http://127.0.0.1:{port}")
        out = []
        try:
            for i, t in enumerate(clock):
                now[0] = t
                if flip and i in flip:
                    engine.sleeping = flip[i]
                out.append((await adapter.scrape(rep)).weights)
        finally:
            await adapter.close()
            await engine.http.stop()
        return out

    return asyncio.run(go())


def test_an_old_vllm_is_asked_is_sleeping_at_most_every_second():
    engine = _OldVllm(sleeping=True)
    got = _scrapes(engine, [0.0, 0.05, 0.5, 1.0, 1.05, 2.5], flip={3: False})
    assert got == ["cold", "cold", "cold", "warm", "warm", "warm"]  # between asks: the last answer
    assert engine.asked.count("/is_sleeping") == 3  # at 0, 1.0 and 2.5 (was never: routed to while asleep)
    assert engine.asked.count("/metrics") == 6


def test_an_absent_is_sleeping_is_asked_again_only_a_minute_later():
    engine = _OldVllm(sleeping=None)
    got = _scrapes(engine, [0.0, 0.05, 1.0, 30.0, 59.0, 60.0, 60.5], flip={5: True})
    assert got == [None, None, None, None, None, "cold", "cold"]  # the page does not say, nor does the replica
    assert engine.asked.count("/is_sleeping") == 2  # at 0 (404) and 60 (now there: sleeping)


def test_a_sleeper_that_no_longer_reports_sleep_is_awake():
    engine = _OldVllm(sleeping=True)
    # restarted without dev mode: no /is_sleeping any more; a fresh vLLM is awake (was: cold for good)
    assert _scrapes(engine, [0.0, 1.0, 2.0], flip={1: None}) == ["cold", "warm", None]
    gauge = OLD_PAGE + b'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0\n'
    engine = _OldVllm(sleeping=None, page=gauge)

    async def restarted(request: HttpRequest) -> None:  # the same replica as an older vLLM: no gauge, no route
        engine.asked.append("/metrics")
        request.respond(200, OLD_PAGE if len(engine.asked) > 1 else gauge, b"text/plain")

    engine.http.route("GET", "/metrics", restarted)
    assert _scrapes(engine, [0.0, 1.0]) == ["cold", "warm"]


def test_a_page_with_the_gauge_is_never_asked_is_sleeping():
    page = OLD_PAGE + b'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0\n'
    engine = _OldVllm(sleeping=False, page=page)
    assert _scrapes(engine, [0.0, 1.0, 120.0]) == ["cold", "cold", "cold"]  # the gauge, not the route
    assert "/is_sleeping" not in engine.asked


def test_an_answer_that_is_not_vllms_counts_as_absent():
    engine = _OldVllm(sleeping=False)

    async def not_vllm(request: HttpRequest) -> None:
        engine.asked.append("/is_sleeping")
        request.respond(200, b"# a metrics page served on every path\n", b"text/plain")

    engine.http.route("GET", "/is_sleeping", not_vllm)
    assert _scrapes(engine, [0.0, 1.0, 2.0, 61.0]) == [None, None, None, None]
    assert engine.asked.count("/is_sleeping") == 2  # at 0 and 61
