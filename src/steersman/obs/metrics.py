"""The gateway's own Prometheus metrics (``/metrics`` of the gateway).

Names use the ``steersman:`` prefix and the same buckets as vLLM's histograms so
gateway and engine views line up on one dashboard.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["GatewayMetrics"]

_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_E2E = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class _PerModel:
    __slots__ = ("ttft", "itl", "e2e")

    def __init__(self, m: GatewayMetrics, model: str) -> None:
        self.ttft = m._ttft.labels(model)
        self.itl = m._itl.labels(model)
        self.e2e = m._e2e.labels(model)


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        self._requests = Counter("steersman:requests", "Requests answered, by model and HTTP status.", ["model", "status"], registry=r)
        self._ttft = Histogram("steersman:time_to_first_token_seconds", "Gateway-observed time to first streamed byte.", ["model"], buckets=_TTFT, registry=r)
        self._itl = Histogram("steersman:inter_token_latency_seconds", "Gap between streamed chunks as relayed.", ["model"], buckets=_ITL, registry=r)
        self._e2e = Histogram("steersman:e2e_request_latency_seconds", "Request latency end to end at the gateway.", ["model"], buckets=_E2E, registry=r)
        self.in_flight = Gauge("steersman:requests_in_flight", "Requests being served.", registry=r)
        self._upstream_errors = Counter("steersman:upstream_errors", "Failures talking to engines, by replica and kind.", ["replica", "kind"], registry=r)
        self._models: dict[str, _PerModel] = {}
        self._status: dict[tuple[str, int], object] = {}

    def model(self, model: str) -> _PerModel:
        pm = self._models.get(model)
        if pm is None:
            pm = self._models[model] = _PerModel(self, model)
        return pm

    def count(self, model: str, status: int) -> None:
        key = (model, status)
        c = self._status.get(key)
        if c is None:
            c = self._status[key] = self._requests.labels(model, str(status))
        c.inc()

    def upstream_error(self, replica: str, kind: str) -> None:
        self._upstream_errors.labels(replica, kind).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
