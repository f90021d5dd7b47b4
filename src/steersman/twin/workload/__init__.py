"""Workloads for the digital twin: seeded, deterministic event sources of requests.

* :mod:`.base` -- :class:`Arrival`, the :class:`Workload` protocol an event loop
  drives (open-loop arrivals pulled in time windows, closed-loop follow-ups
  pushed on completion), :class:`OfferedLoad`, :class:`WorkloadStats`;
* :mod:`.hashing` -- prompt block hashes without tokens (equal hash = equal prefix);
* :mod:`.apps` -- the application shapes (chatbot, copilot, research agent, autonomous task);
* :mod:`.agents` -- their tasks and calls;
* :mod:`.trace_data` -- loading the Azure LLM 2023 and Mooncake traces;
* :mod:`.traces` -- their replay with a time-scale knob;
* :mod:`.mix` -- several sources and their tenants as one workload;
* :mod:`.curve` -- a daily load curve shaping a source's rate;
* :mod:`.spec` -- the YAML workload spec (:func:`load_workload`).
"""

from steersman.twin.workload.agents import PRESETS, AgentApp, AgentSource, preset
from steersman.twin.workload.base import Arrival, OfferedLoad, SourceInfo, Workload, WorkloadStats
from steersman.twin.workload.curve import DailyCurve, hourly_offered_load, parse_curve
from steersman.twin.workload.dists import Dist, parse_dist
from steersman.twin.workload.mix import Mix
from steersman.twin.workload.spec import WorkloadSpecError, load_workload, parse_workload
from steersman.twin.workload.traces import TraceData, TraceSource, load_trace

__all__ = [
    "Arrival", "Workload", "OfferedLoad", "WorkloadStats", "SourceInfo",
    "AgentApp", "AgentSource", "PRESETS", "preset",
    "TraceData", "TraceSource", "load_trace",
    "Mix", "DailyCurve", "parse_curve", "hourly_offered_load", "Dist", "parse_dist",
    "load_workload", "parse_workload", "WorkloadSpecError",
]
