"""Settings of the reliability mechanisms: outlier ejection, circuit breakers, retries, concurrency, brown-out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from steersman.config._base import check_bounds, setting

__all__ = ["ReliabilitySettings"]


@dataclass(frozen=True, slots=True)
class ReliabilitySettings:
    # ---- outlier ejection (passive health) -------------------------------------------------
    consecutive_failures: int = setting(
        5, "Envoy outlier detection consecutive_5xx default 5 (5xx, connect failures, broken streams, timeouts)", ge=1
    )
    base_ejection_time_s: float = setting(
        30.0, "Envoy outlier detection base_ejection_time 30 s; the real time is base x number of ejections, at most "
        "max_ejection_time_s", gt=0, le="max_ejection_time_s"
    )
    max_ejection_time_s: float = setting(300.0, "Envoy outlier detection max_ejection_time default 300 s", gt=0)
    ejection_decay_s: float = setting(
        10.0, "Envoy outlier detection interval 10 s: each sweep without an ejection lowers the multiplier by one", gt=0
    )
    max_ejection_percent: float = setting(10.0, "Envoy outlier detection max_ejection_percent default 10%", le=100)
    always_eject_one: bool = setting(
        True,
        "Envoy (v1.8-v1.27 docs: 'will eject at least one host regardless of the value'; later opt-in as "
        "always_eject_one_host) and gRPC-java PR 9489: with 2-4 replicas 10% would otherwise mean none",
    )
    latency_outlier_ratio: float = setting(
        3.0,
        "design: a replica whose TTFT / TPOT / stalled first token is >= 3x its peers' median is an outlier; "
        "H100 vs A100 replicas differ ~2x (roofline), the issue's degraded GPU is 5x", ge=1,
    )
    latency_floor_ttft_s: float = setting(
        2.0, "never a latency outlier while within the standard SLO class TTFT target (MLPerf server 2 s)"
    )
    latency_floor_tpot_s: float = setting(
        0.2, "never a latency outlier while within the standard SLO class TPOT target (MLPerf server 200 ms)"
    )
    latency_min_samples: int = setting(
        5, "design: a replica's latency is judged after as many samples as consecutive_5xx needs failures (5)", ge=1
    )
    outlier_sweep_s: float = setting(
        0.1,
        "design: latency outliers are re-judged every 100 ms (Envoy sweeps every interval, 10 s; a hung LLM "
        "replica must be out within the issue's 10 s)", gt=0,
    )
    stream_idle_timeout_s: float = setting(
        30.0, "Envoy stream_idle_timeout (default 5 min) cut for LLM streams: a stream under way that gets no "
        "event for 30 s is stalled (inter-token gaps are well under a second on a serving engine); its engine "
        "connection is dropped and it continues on another replica", gt=0
    )
    uneject_on_active_health: bool = setting(
        False,
        "Envoy successful_active_health_check_uneject_host defaults true; false here: a hung GPU's engine "
        "still answers /metrics and /health, so a good scrape says nothing about serving",
    )
    restart_down_s: float = setting(
        1.0, "design: a replica whose health checks failed for at least 1 s (counted from the check that marked it "
        "down, gateway.unhealthy_after_failures) and pass again restarted (an engine process comes back in seconds: "
        "its weights load), and leaves an ejection its death caused; a blip of a few failed checks is no restart and "
        "lifts nothing", gt=0,
    )
    idle_probe_s: float = setting(
        5.0, "Envoy active health checking (health_check interval; 5 s is its documented examples' interval), asked "
        "only where the passive signals are silent: a replica with nothing of ours in flight that has shown no sign "
        "of life (an answer, a stream's event, an advance of its engine's work counter, a probe answered) for 5 s "
        "gets a canary request (1 output token).  A hung GPU's engine still answers /metrics, and an idle one got "
        "no request for the stall rule to judge: the first request sent there waited for the stall rule to notice.  "
        "0 turns it off", ge=0
    )
    idle_probe_timeout_s: float = setting(
        4.0, "Envoy active health check timeout (required; its examples use 1-5 s): a canary of one output token on "
        "a replica with nothing of ours running answers in milliseconds on a GPU (~0.1 s for a cold prompt on a "
        "llama.cpp CPU replica here); no answer in 4 s and no sign of work meanwhile ejects it (idle_probe_s + "
        "this stays within the reliability issue's 10 s to take out a hung replica)", gt=0
    )
    # ---- circuit breaker ---------------------------------------------------------------------
    breaker_window_s: float = setting(10.0, "Hystrix metrics.rollingStats.timeInMilliseconds 10000", gt=0)
    breaker_buckets: int = setting(
        10, "Hystrix metrics.rollingStats.numBuckets 10.  At most 1,000 (design: a replica's window is a list of "
        "buckets, and an advance clears the ones passed on the event loop; 2,000,000 stalled the loop 0.2 s an "
        "advance, 1e9 ran out of memory; 1,000 buckets are 10 ms each of the default window)", ge=1, le=1000)
    breaker_min_requests: int = setting(20, "Hystrix circuitBreaker.requestVolumeThreshold 20", ge=1)
    breaker_error_percent: float = setting(50.0, "Hystrix circuitBreaker.errorThresholdPercentage 50", gt=0, le=100)
    breaker_open_s: float = setting(5.0, "Hystrix circuitBreaker.sleepWindowInMilliseconds 5000", gt=0)
    breaker_half_open_probes: int = setting(
        1, "Hystrix lets a single test request through a half-open breaker; its success closes it", ge=1
    )
    failure_routing: bool = setting(
        True, "design (Envoy's success-rate outlier detection and Finagle's failure accrual act on the same "
        "signal, all or nothing): the picker prices a replica's recent server-side failure share p over the "
        "breaker's window (at least breaker_min_requests results) as 1 / (1 - p) attempts a success, on its "
        "predicted TTFT, end-to-end latency and cost.  A replica that fails fast holds few requests, so by load "
        "alone it looked the least busy and drew traffic; the penalty ends as its failures leave the window"
    )
    # ---- retries ------------------------------------------------------------------------------
    retry_budget_percent: float = setting(20.0, "Envoy retry_budget budget_percent default 20% (a percentage)", le=100)
    retry_min_concurrency: int = setting(3, "Envoy retry_budget min_retry_concurrency default 3")
    retry_max_attempts: int = setting(
        3, "design: 3 upstream attempts in all, between Envoy num_retries default 1 (2 attempts) and gRPC's cap of maxAttempts 5", ge=1
    )
    retry_base_backoff_s: float = setting(
        0.025, "Envoy retry_policy base_interval default 25 ms (Envoy: max_interval must be >= base_interval)",
        le="retry_max_backoff_s")
    retry_max_backoff_s: float = setting(0.25, "Envoy retry_policy max_interval default 10 x base_interval")
    workflow_retry_share: float = setting(
        2.0,
        "issue #5: a protected workflow step (value > 0) may use this multiple of the retry budget's share; "
        "2x of 20% still bounds retries to 40% of active requests",
    )
    throttle_k: float = setting(2.0, "Google SRE book ch. 21 client-side adaptive throttling: K = 2", gt=0)
    throttle_window_s: float = setting(
        30.0, "Envoy admission control (its client-side throttling from the SRE book) sampling_window default 30 s "
        "(the SRE book's 2 minutes kept a 0.2 s burst of failures refusing attempts for 2 minutes after the engines "
        "had recovered)", gt=0)
    throttle_buckets: int = setting(
        12, "design: the 30 s window kept as 12 buckets of 2.5 s; at most 1,000, as breaker_buckets", ge=1, le=1000)
    throttle_max_reject: float = setting(
        0.8, "Envoy admission control max_rejection_probability default 80%: a failing fleet still gets a fifth of "
        "the attempts, whose answers show its recovery", gt=0, le=1)
    throttle_min_requests: int = setting(
        20, "Hystrix circuitBreaker.requestVolumeThreshold 20 (as breaker_min_requests): the SRE formula alone rejects "
        "half of all attempts after a gateway's first failure (1 request, 0 accepts: p = 1/2), a healthy replica's "
        "retry included, and each local rejection counts as a request, so p climbs on (a fresh gateway whose first "
        "request met a failing replica refused the next 3 of 3); the throttle judges a volume, not one failure"
    )
    # ---- adaptive concurrency (Netflix concurrency-limits Gradient2) ---------------------------
    probation_limit: float = setting(
        1.0, "Hystrix circuit breaker half-open: a single trial request; here a replica back from an ejection "
        "takes 1 request at a time until it shows progress (a first token or a whole answer)", ge=1
    )
    limit_initial: float = setting(
        20.0, "Netflix concurrency-limits Gradient2Limit initialLimit 20 (the limit moves within [limit_min, "
        "limit_max])", ge="limit_min", le="limit_max")
    limit_min: float = setting(3.0, "Envoy adaptive concurrency min_concurrency default 3", ge=1, le="limit_max")
    limit_max: float = setting(200.0, "Netflix concurrency-limits Gradient2Limit maxConcurrency 200", ge=1)
    limit_smoothing: float = setting(0.2, "Netflix concurrency-limits Gradient2Limit smoothing 0.2", gt=0, le=1)
    limit_rtt_tolerance: float = setting(1.5, "Netflix concurrency-limits Gradient2Limit rttTolerance 1.5", ge=1)
    limit_long_window: int = setting(600, "Netflix concurrency-limits Gradient2Limit longWindow 600 samples", ge=1)
    limit_queue_size: float = setting(4.0, "Netflix concurrency-limits Gradient2Limit queueSize 4")
    limit_backoff_ratio: float = setting(0.9, "Netflix concurrency-limits AIMDLimit backoffRatio 0.9 on a failure", gt=0, le=1)
    # ---- brown-out (cascade protection) -------------------------------------------------------
    brownout_queue_depth: int = setting(
        64, "design: 64 requests waiting in the gateway for one model (1/16 of queue_max_entries) whose replicas are "
            "all full mean that model is saturated (where brown-out begins)"
    )
    brownout_leave_fraction: float = setting(
        0.5, "Envoy's watermark buffers (source/common/buffer/watermark_buffer.cc: low_watermark_ = high_watermark / "
             "2): a hysteresis band.  Brown-out begins at brownout_queue_depth and ends only once the model's backlog "
             "is below this fraction of it (32 of 64), so a backlog hovering at the threshold does not move every "
             "other request of a conversation to the other model", gt=0, le=1
    )
    brownout_stabilization_s: float = setting(
        300.0, "Kubernetes HPA scale-down stabilization window default (behavior.scaleDown.stabilizationWindowSeconds, "
               "--horizontal-pod-autoscaler-downscale-stabilization 5m; no window to scale up): brown-out begins at "
               "once and ends only after the backlog has stayed below the leave depth this long, so a user's "
               "consecutive turns stay on one model and the cheaper model's prefix caches are not thrashed"
    )
    brownout_models: Mapping[str, str] = setting(
        MappingProxyType({}), "issue #5: no cheaper model unless the fleet file names one (sheddable traffic is rejected)"
    )

    def __post_init__(self) -> None:
        check_bounds(self)
