"""Scheduling: pure policies over frozen fleet snapshots, built from registered plugins.

``make_policy(name)`` gives a named profile: ``steersman`` (the model-based
default) or a baseline (``round-robin``, ``random``, ``least-request``,
``power-of-two``, ``sglang-cache-aware``, ``llm-d``, ``dynamo-kv``, ``preble-e2``).
``make_decode_picker(name)`` gives the prefill/decode hand-off's decode picker (``least-loaded``).
"""

from steersman.config import DEFAULTS, SchedulerSettings
from steersman.policy import model_based, predict, reliability, scorers  # noqa: F401  (registers plugins)
from steersman.policy.base import POLICIES, Decision, Queue, Reject, Route, RoutingPolicy
from steersman.policy.decode import DECODE_PICKERS, DecodePicker, decode_model, make_decode_picker
from steersman.policy.framework import FILTERS, PICKERS, PLUGIN_LATENCY, SCORERS, DecisionContext, Profile, WeightedScorer, build
from steersman.policy.request import LatencyBudget, PriorityClass, SchedRequest, WorkflowView

from steersman.policy import baselines  # noqa: F401,E402  (registers the baseline profiles)

__all__ = [
    "POLICIES", "PLUGIN_LATENCY", "FILTERS", "SCORERS", "PICKERS", "Decision", "Route", "Queue", "Reject", "RoutingPolicy",
    "DecisionContext", "Profile", "WeightedScorer", "build", "make_policy",
    "DECODE_PICKERS", "DecodePicker", "decode_model", "make_decode_picker",
    "SchedRequest", "LatencyBudget", "PriorityClass", "WorkflowView",
]


def make_policy(name: str, settings: SchedulerSettings = DEFAULTS.scheduler) -> RoutingPolicy:
    return POLICIES.build(name, settings)
