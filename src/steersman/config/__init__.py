"""Every default of steersman, in one frozen object (:data:`DEFAULTS`).

Each field is declared with :func:`~steersman.config._base.setting`, which records
where its value comes from; ``steersman defaults`` prints the table and
``tests/test_defaults.py`` pins every value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from steersman.config._base import sources
from steersman.config.admission import AdmissionSettings
from steersman.config.engine import EngineSettings
from steersman.config.gateway import GatewaySettings
from steersman.config.reliability import ReliabilitySettings
from steersman.config.llamacpp import LlamaCppSettings
from steersman.config.scheduler import SchedulerSettings, SloClass
from steersman.config.simserver import SimServerSettings
from steersman.config.twin import TwinSettings

__all__ = ["Settings", "DEFAULTS", "AdmissionSettings", "EngineSettings", "GatewaySettings", "LlamaCppSettings", "ReliabilitySettings", "SchedulerSettings", "SimServerSettings", "SloClass", "TwinSettings", "sources"]


@dataclass(frozen=True, slots=True)
class Settings:
    engine: EngineSettings = field(default_factory=EngineSettings)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    sim_server: SimServerSettings = field(default_factory=SimServerSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    llamacpp: LlamaCppSettings = field(default_factory=LlamaCppSettings)
    reliability: ReliabilitySettings = field(default_factory=ReliabilitySettings)
    twin: TwinSettings = field(default_factory=TwinSettings)


DEFAULTS = Settings()
