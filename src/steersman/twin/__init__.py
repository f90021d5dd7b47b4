"""The digital twin: steersman's real control plane against simulated GPU fleets on a virtual clock."""

from steersman.twin.core import Twin, TwinConfig
from steersman.twin.fleet import ReplicaPlan, TwinFleet
from steersman.twin.metrics import summarize

__all__ = ["Twin", "TwinConfig", "TwinFleet", "ReplicaPlan", "summarize"]
