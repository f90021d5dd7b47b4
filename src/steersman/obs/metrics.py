"""The gateway's own Prometheus metrics (``/metrics`` of the gateway).

Names use the ``steersman:`` prefix and the same buckets as vLLM's histograms so
gateway and engine views line up on one dashboard.  Everything observed on the
request path is lock-free (:mod:`steersman.obs.histogram`); gauges that mirror
state are read at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily

from steersman.config import DEFAULTS
from steersman.obs.gcwatch import GC_BUCKETS, GcPauses
from steersman.obs.histogram import CounterFamily, FastHistogram, HistogramFamily
from steersman.obs.looplag import LAG_BUCKETS, LoopLag

__all__ = ["GatewayMetrics"]

disable_created_metrics()  # no *_created series: they double the exposition for no control-loop use

_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_E2E = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class _PerModel:
    __slots__ = ("ttft", "itl", "e2e")

    def __init__(self, ttft: FastHistogram, itl: FastHistogram, e2e: FastHistogram) -> None:
        self.ttft, self.itl, self.e2e = ttft, itl, e2e


class _CallbackCounter:
    """A counter whose total is read at scrape time (a custom collector: prometheus_client's Counter has no
    ``set_function``)."""

    def __init__(self, name: str, doc: str, read: Callable[[], float]) -> None:
        self._name, self._doc, self._read = name, doc, read

    def collect(self):
        fam = CounterMetricFamily(self._name, self._doc)
        fam.add_metric([], self._read())
        yield fam


class GatewayMetrics:
    def __init__(self, loop_lag_interval_s: float = DEFAULTS.gateway.loop_lag_interval_s) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        self.requests = CounterFamily("steersman:requests", "Requests answered, by model and HTTP status.", ["model", "status"])
        self.upstream_errors = CounterFamily("steersman:upstream_errors", "Failures talking to engines, by replica and kind.", ["replica", "kind"])
        self._ttft = HistogramFamily("steersman:time_to_first_token_seconds", "Gateway-observed time to first streamed byte.", ["model"], _TTFT)
        self._itl = HistogramFamily("steersman:inter_token_latency_seconds", "Gap between streamed chunks as relayed.", ["model"], _ITL)
        self._e2e = HistogramFamily("steersman:e2e_request_latency_seconds", "Request latency end to end at the gateway (requests answered 200).", ["model"], _E2E)
        self.routes = CounterFamily(
            "steersman:routes", "Dispatches to a replica, by model and what the route predicted of the request's SLO: "
            "met, missed (no replica was predicted to meet it: an overload signal), none (the profile does not predict).",
            ["model", "slo_prediction"])
        gc_pauses = HistogramFamily("steersman:gc_pause_seconds", "Garbage-collector pauses of the gateway process by "
                                    "generation: the event loop (every stream in flight) stalls for each.",
                                    ["generation"], GC_BUCKETS)
        self.gc = GcPauses(gc_pauses)  # installed while the gateway runs (Gateway.start / stop)
        loop_lag = HistogramFamily("steersman:event_loop_lag_seconds", "How late the gateway's event loop ran a timer "
                                   "that was due: the wait every request and relayed chunk in flight shares.", [],
                                   LAG_BUCKETS)
        self.loop_lag = LoopLag(loop_lag.labels(), loop_lag_interval_s)  # started while the gateway runs
        for fam in (self.requests, self.upstream_errors, self.routes, self._ttft, self._itl, self._e2e, gc_pauses,
                    loop_lag):
            r.register(fam)
        self._in_flight = Gauge("steersman:requests_in_flight", "Requests being served.", registry=r)
        self._queued = Gauge("steersman:requests_queued", "Requests waiting in the gateway queue.", registry=r)
        self._models: dict[str, _PerModel] = {}

    def track_in_flight(self, read: Callable[[], float]) -> None:
        """The in-flight gauge is read from the fleet's accounting at scrape time."""
        self._in_flight.set_function(read)

    def track_queue(self, read: Callable[[], float]) -> None:
        self._queued.set_function(read)

    def track_busy_poll(self, spent: Callable[[], float], preempted: Callable[[], float]) -> None:
        """Busy polling (``gateway.busy_poll_s``): the core time it spent, and how often it backed off."""
        self.registry.register(_CallbackCounter("steersman:busy_poll_seconds", "Seconds the event loop polled "
                                                "instead of sleeping (gateway.busy_poll_s): a core's time each.", spent))
        self.registry.register(_CallbackCounter("steersman:busy_poll_preemptions", "Spins ended because the "
                                                "gateway's thread was kept off its core (then no spin for a second): "
                                                "its core is contended.", preempted))

    def model(self, model: str) -> _PerModel:
        pm = self._models.get(model)
        if pm is None:
            pm = self._models[model] = _PerModel(self._ttft.labels(model), self._itl.labels(model), self._e2e.labels(model))
        return pm

    def count(self, model: str, status: int) -> None:
        self.requests.inc(model, str(status))

    def routed(self, model: str, slo_prediction: str) -> None:
        self.routes.inc(model, slo_prediction)

    def upstream_error(self, replica: str, kind: str) -> None:
        self.upstream_errors.inc(replica, kind)

    def render(self) -> bytes:
        return generate_latest(self.registry)
