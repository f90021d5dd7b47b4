"""The fleet file (YAML): gateway settings, engine endpoints, an embedded simulated fleet.

```yaml
gateway: {host: 127.0.0.1, port: 8080}       # any GatewaySettings field
policy: least-outstanding                      # a registered routing policy
endpoints:                                     # engines already running
  - {name: h100-0, url: "http://10.0.0.5:8000", engine: vllm, gpu: H100, models: [llama-3.1-8b], pool: main}
simulated:                                     # engine-sim replicas started for you
  speedup: 1.0
  replicas:
    - {gpu: H100, model: llama-3.1-8b, count: 2}
```
Upstream URLs come from this file only; requests cannot name them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import yaml

from steersman.config import DEFAULTS, GatewaySettings

__all__ = ["EndpointConfig", "SimReplicaConfig", "SimulatedFleetConfig", "FleetConfig", "load_fleet", "parse_fleet", "FleetConfigError"]


class FleetConfigError(ValueError):
    pass


class EndpointConfig(msgspec.Struct, forbid_unknown_fields=True):
    url: str
    name: str | None = None
    engine: str = "openai"
    gpu: str | None = None
    models: list[str] = msgspec.field(default_factory=list)
    pool: str = "default"
    price_per_hour: float | None = None
    tp: int = 1


class SimReplicaConfig(msgspec.Struct, forbid_unknown_fields=True):
    gpu: str
    model: str
    count: int = 1
    tp: int = 1
    pool: str = "default"
    served_model_name: str | None = None
    cold_start: bool = False


class SimulatedFleetConfig(msgspec.Struct, forbid_unknown_fields=True):
    replicas: list[SimReplicaConfig]
    speedup: float = DEFAULTS.sim_server.speedup


class _FleetFile(msgspec.Struct, forbid_unknown_fields=True):
    gateway: dict[str, Any] = msgspec.field(default_factory=dict)
    policy: str = "least-outstanding"
    endpoints: list[EndpointConfig] = msgspec.field(default_factory=list)
    simulated: SimulatedFleetConfig | None = None


class FleetConfig(msgspec.Struct, frozen=True):
    gateway: GatewaySettings
    policy: str
    endpoints: tuple[EndpointConfig, ...]
    simulated: SimulatedFleetConfig | None


def parse_fleet(data: Any, where: str = "fleet config") -> FleetConfig:
    try:
        raw = msgspec.convert(data if data is not None else {}, _FleetFile)
        gw = msgspec.convert(raw.gateway, dict[str, Any])
        fields = set(GatewaySettings.__dataclass_fields__)
        unknown = sorted(set(gw) - fields)
        if unknown:
            raise FleetConfigError(f"{where}: unknown gateway setting(s) {unknown}; known: {sorted(fields)}")
        gateway = msgspec.convert({**_asdict(DEFAULTS.gateway), **gw}, GatewaySettings)
    except msgspec.ValidationError as e:
        raise FleetConfigError(f"{where}: {e}") from None
    if not raw.endpoints and raw.simulated is None:
        raise FleetConfigError(f"{where}: no `endpoints` and no `simulated` fleet: nothing to route to")
    for i, ep in enumerate(raw.endpoints):
        if not ep.url.startswith(("http://", "https://")):
            raise FleetConfigError(f"{where}: endpoints[{i}].url must be an http(s) URL, got {ep.url!r}")
    if raw.simulated is not None:
        for i, r in enumerate(raw.simulated.replicas):
            if r.count < 1:
                raise FleetConfigError(f"{where}: simulated.replicas[{i}].count must be >= 1")
    return FleetConfig(gateway, raw.policy, tuple(raw.endpoints), raw.simulated)


def _asdict(settings: GatewaySettings) -> dict[str, Any]:
    return {f: getattr(settings, f) for f in settings.__dataclass_fields__}


def load_fleet(path: str | Path) -> FleetConfig:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise FleetConfigError(f"cannot read {p}: {e}") from None
    except yaml.YAMLError as e:
        raise FleetConfigError(f"{p}: invalid YAML: {e}") from None
    return parse_fleet(data, str(p))


def with_gateway(cfg: FleetConfig, **overrides: Any) -> FleetConfig:
    """The same fleet with some gateway settings changed (CLI flags)."""
    changes = {k: v for k, v in overrides.items() if v is not None}
    return FleetConfig(replace(cfg.gateway, **changes), cfg.policy, cfg.endpoints, cfg.simulated)
