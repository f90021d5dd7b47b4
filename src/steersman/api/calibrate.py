"""One short request to each fresh unprofiled engine before the gateway serves (``gateway.calibrate_unprofiled``).

A replica without a roofline profile (a llama.cpp engine on a CPU, say) is predicted from the engine's own
timing counters (:func:`steersman.policy.predict.unprofiled_speeds`); a fresh engine has none yet, and the
priors can be several times off.  The gateway sends each such replica one request (a ~200-word prompt, 8
generated tokens, not streamed), then scrapes it again: the first decisions already see the engine's speed.
Replicas that fail or time out keep the priors (a warning); the gateway starts anyway.
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from steersman.engines.base import UpstreamError
from steersman.fleet.scraper import Scraper
from steersman.fleet.state import Fleet

__all__ = ["calibrate", "CALIBRATION_PROMPT"]

log = logging.getLogger("steersman.gateway")

_WORDS = ("the", "engine", "measures", "how", "long", "a", "prompt", "takes", "to", "compute", "and", "each",
          "token", "after", "it", "so", "routing", "knows", "its", "speed")
#: ~200 words of plain text: long enough that the prompt's own time dominates the step's fixed cost
CALIBRATION_PROMPT = "steersman calibration: " + " ".join(_WORDS[(k * 7) % len(_WORDS)] for k in range(200))


async def _one(fleet: Fleet, scraper: Scraper, i: int, timeout_s: float) -> None:
    rep = fleet.replicas[i]
    body = orjson.dumps({"model": rep.models[0], "messages": [{"role": "user", "content": CALIBRATION_PROMPT}],
                         "max_tokens": 8, "stream": False})
    try:
        async with asyncio.timeout(timeout_s):
            exch = await rep.adapter.send(rep.address, "/v1/chat/completions", body)
            await exch.read()
        if exch.status != 200:
            raise UpstreamError(f"answered {exch.status}", connected=True)
    except (UpstreamError, TimeoutError, OSError) as e:
        log.warning("calibration request to %s failed (%s): it is predicted from the priors until it has worked",
                    rep.name, e)
        return
    await scraper.scrape_once(rep)


async def calibrate(fleet: Fleet, scraper: Scraper, timeout_s: float) -> list[int]:
    """Calibrate every replica that needs it, concurrently; returns their indices."""
    todo = [r.index for r in fleet.replicas
            if r.models and not fleet.statics.modelled[r.index] and fleet.timing_unlearnt(r.index)]
    await asyncio.gather(*(_one(fleet, scraper, i, timeout_s) for i in todo))
    return todo
