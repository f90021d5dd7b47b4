"""The engine model as it was before lazy decoding (commit 924c35a), kept as a test oracle.

request.py, kvcache.py, scheduler.py, macro.py and engine.py of that commit, one module each
here, renamed (LegacyRequest, LegacyEngineModel); everything else is verbatim (kept independent
of the current engine on purpose, so it can serve as the oracle).
The equivalence tests run it beside the current engine, and
``bench/twin/engine_speed.py --old`` times it.  Do not change its behaviour.
"""

from legacy_engine.engine import EngineState, LegacyEngineModel, StepResult, WeightsState
from legacy_engine.kvcache import KVPool
from legacy_engine.macro import MacroStep, advance
from legacy_engine.request import ABORTED, FINISHED, RUNNING, WAITING, LegacyRequest
from legacy_engine.scheduler import FcfsQueue, PriorityQueue, Scheduler

__all__ = ["ABORTED", "FINISHED", "RUNNING", "WAITING", "EngineState", "FcfsQueue", "KVPool", "LegacyEngineModel",
           "LegacyRequest", "MacroStep", "PriorityQueue", "Scheduler", "StepResult", "WeightsState", "advance"]
