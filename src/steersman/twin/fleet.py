"""The simulated fleet of a twin run, built from the same fleet file the gateway reads.

Every ``simulated:`` replica, and every ``endpoints:`` entry that names a known
GPU and model, becomes an engine-model replica (:class:`SimReplica`); the
scheduler, admission and tenant settings of the file apply unchanged.

Prefill/decode disaggregation (``role: prefill`` / ``role: decode`` replicas, see
:mod:`steersman.twin.pd`): the gateway-side fleet the policy sees lists decode
replicas under a model name no request asks for (``<model>@decode``), so the
routing policy places requests on prefill (and ``both``) replicas only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from steersman.config import DEFAULTS, AdmissionSettings, EngineSettings, SchedulerSettings
from steersman.fleet.config import FleetConfig, FleetConfigError, endpoint_name
from steersman.fleet.kv_events import KvEventMirror
from steersman.fleet.prefix_index import PrefixIndex
from steersman.policy.decode import decode_model
from steersman.twin.pd import handoff_s_per_token
from steersman.fleet.state import Fleet, Replica
from steersman.sim import EngineModel, gpu_profile, model_profile
from steersman.twin.replica import SimReplica

__all__ = ["ReplicaPlan", "TwinFleet"]


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    name: str
    gpu: str
    model: str
    tp: int = 1
    pool: str = "default"
    served_model_name: str | None = None
    engine: EngineSettings = DEFAULTS.engine
    role: str = "both"  # prefill | decode | both (prefill/decode disaggregation)

    @property
    def price_per_hour(self) -> float:
        return gpu_profile(self.gpu).price_per_hour * self.tp


class TwinFleet:
    """Replica plans plus the engine models and the gateway-side fleet state built from them."""

    def __init__(self, plans: list[ReplicaPlan], scheduler: SchedulerSettings = DEFAULTS.scheduler,
                 admission: AdmissionSettings = DEFAULTS.admission,
                 kv_link_gbit_s: float = DEFAULTS.engine.kv_link_gbit_s) -> None:
        if not plans:
            raise FleetConfigError("the fleet has no replica the twin can simulate")
        self.plans = plans
        self.kv_link_gbit_s = kv_link_gbit_s
        self.disaggregated = any(p.role != "both" for p in plans)
        self.scheduler = scheduler
        self.admission = admission
        self.block_size = DEFAULTS.engine.block_size
        self.replicas = [
            SimReplica(i, EngineModel(gpu_profile(p.gpu), model_profile(p.model), replace(p.engine, tensor_parallel=p.tp),
                                      warm=True, now=0.0, keep_done=0))
            for i, p in enumerate(plans)
        ]

    @classmethod
    def from_config(cls, cfg: FleetConfig) -> TwinFleet:
        plans: list[ReplicaPlan] = []
        if cfg.simulated is not None:
            for spec in cfg.simulated.replicas:
                gpu = gpu_profile(spec.gpu).name
                for k in range(spec.count):
                    plans.append(ReplicaPlan(f"{spec.pool}-{gpu.lower()}-{len(plans)}", spec.gpu, spec.model, spec.tp,
                                             spec.pool, spec.served_model_name, role=spec.role,
                                             engine=_engine(spec.scheduling)))
        for i, ep in enumerate(cfg.endpoints):
            if ep.gpu and ep.models:
                model = ep.model_profile or ep.models[0]  # (served as models[0] under another name)
                try:
                    model_profile(model)
                except KeyError:
                    continue
                plans.append(ReplicaPlan(endpoint_name(i, ep), ep.gpu, model, ep.tp, ep.pool,
                                         ep.models[0] if ep.model_profile else None, engine=_engine(ep.scheduling)))
        link = cfg.simulated.kv_link_gbit_s if cfg.simulated is not None else None
        return cls(plans, cfg.scheduler, cfg.admission, link if link is not None else DEFAULTS.engine.kv_link_gbit_s)

    def build_state(self, clock, kv_events: bool = False) -> Fleet:
        """The gateway-side fleet state; ``kv_events``: every engine publishes its KV events and the prefix index
        takes each replica's match from them (:mod:`steersman.fleet.kv_events`)."""
        reps = [Replica(i, p.name, f"http://twin.invalid/{p.name}", "engine-sim", gpu_profile(p.gpu).name,
                        (p.served_model_name or p.model,) if p.role != "decode" else (decode_model(p.served_model_name or p.model),),
                        p.pool, p.price_per_hour, p.tp, adapter=None,
                        priority_scheduling=p.engine.scheduling_policy == "priority",
                        handoff_s_per_token=handoff_s_per_token(p.model, p.tp, self.kv_link_gbit_s)
                        if p.role == "prefill" else 0.0,
                        model_profile=p.model)  # (listed under a served name, or as a decode replica)
                for i, p in enumerate(self.plans)]
        fleet = Fleet(reps, clock, self.scheduler)
        fleet.prefix = PrefixIndex(len(reps), self.scheduler.prefix_index_max_mib * 2**20)
        for i, r in enumerate(self.replicas):
            mirror = KvEventMirror(self.scheduler.kv_events_mismatch_after) if kv_events else None
            if mirror is not None:
                fleet.prefix.mirror_events(i, mirror)
            r.engine.kv.listener = mirror
        return fleet

    @property
    def price_per_hour(self) -> float:
        return sum(p.price_per_hour for p in self.plans)


def _engine(scheduling: str) -> EngineSettings:
    """The replica's engine settings: the defaults, with the fleet file's scheduling policy."""
    return DEFAULTS.engine if scheduling == DEFAULTS.engine.scheduling_policy else replace(
        DEFAULTS.engine, scheduling_policy=scheduling)
