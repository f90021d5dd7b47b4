"""Settings of the gateway process (HTTP front door, upstream pool, metrics)."""

from __future__ import annotations

from dataclasses import dataclass

from steersman.config._base import check_bounds, setting, shown
from steersman.config._urls import http_url_problem, redis_url_problem

_TEN_YEARS_S = 10 * 365 * 24 * 3600.0

__all__ = ["GatewaySettings"]


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    host: str = setting("127.0.0.1", "listen on loopback unless told otherwise (safe default)")
    port: int = setting(8080, "issue #2: 'steersman up' serves on 127.0.0.1:8080", le=65535)
    max_body_bytes: int = setting(10 * 1024 * 1024, "issue #2: body over 10 MB is refused with 413", ge=1)
    max_buffered_body_mib: float = setting(
        256.0, "Envoy overload manager (a global bound on buffered bytes, past which new work is refused): request "
        "bodies still arriving, over every connection at once, at most 256 MiB (25 bodies of the 10 MiB limit); past "
        "it the body that would cross it is refused with 503 (a memory audit: 16 stalled 6 MiB uploads took +98 MB, "
        "and nothing bounded how many)", gt=0)
    max_tokens_limit: int = setting(
        131072, "absurd max_tokens bound: 128k, the longest context of the Llama-3.1 family (max_position_embeddings)", ge=1
    )
    max_logprobs: int = setting(
        20, "most log-probability alternatives per token a request may ask for (chat top_logprobs, completions "
        "logprobs): OpenAI's top_logprobs bound, and vLLM's --max-logprobs default"
    )
    max_completion_sequences: int = setting(
        2048, "most sequences one /v1/completions request may run (its batch of prompts x n): OpenAI's bound on "
        "an input array (2,048 items); past it the engine would be handed an unbounded batch from one body", ge=1
    )
    metrics_interval_s: float = setting(
        0.05, "llm-d inference scheduler refreshes endpoint metrics every 50 ms (refreshMetricsInterval); the "
        "deadlines of requests queued in the gateway are re-checked at the same cadence (live and in the twin): a "
        "longer interval answers their 504s, and the 503 of a queue whose replicas all left, that much later", gt=0
    )
    metrics_timeout_s: float = setting(1.0, "a scrape slower than 1 s is treated as failed for that round", gt=0)
    sleep_poll_s: float = setting(
        1.0, "design: a replica whose /metrics has no vllm:engine_sleep_state is asked GET /is_sleeping at most "
        "once a second (the last answer stands between); vLLM before that gauge logs every call at INFO", gt=0
    )
    sleep_recheck_s: float = setting(
        60.0, "design: a replica without /is_sleeping (404, not vLLM's answer) is asked again after 60 s, not "
        "at every scrape (a generic OpenAI server is not asked 20 times a second for a route it lacks)", gt=0
    )
    models_relist_s: float = setting(
        2.0, "design: a replica listed without models whose /v1/models failed (its scrapes succeeding) is asked "
        "again every 2 s until it answers (40 scrape rounds; a server without /v1/models is not hammered)", gt=0
    )
    scrape_error_log_every_s: float = setting(
        60.0, "design: an unexpected error reading a replica's scrape is logged with its traceback at most once a "
        "minute per replica (the scrape loop goes on)", gt=0
    )
    calibrate_unprofiled: bool = setting(
        True, "before it serves, the gateway sends one short request (~200-word prompt, 8 tokens) to each replica "
        "without a roofline profile whose engine reports its own timing but has done no work yet (a fresh "
        "llama-server), so its speed is the engine's from the first request on, not the priors (1 ms a prompt "
        "token; Gemma 3 270M on one CPU thread takes ~5.7 ms: cold prompts predicted ~4x too fast)"
    )
    calibrate_timeout_s: float = setting(
        30.0, "design: a replica that does not answer the calibration request in 30 s is left to the priors "
        "(a warning), the gateway starts anyway", gt=0
    )
    connect_timeout_s: float = setting(2.0, "Envoy cluster connect_timeout is 5 s; 2 s fails over faster on loopback/LAN", gt=0)
    upstream_idle_timeout_s: float = setting(
        4.0, "drop idle engine connections before the engine does: uvicorn (vLLM's server) closes them after 5 s", gt=0
    )
    upstream_preconnect: bool = setting(
        True, "when an engine closes a connection that served a request, open a spare one at once, so the next "
        "request does not wait for a connect (Envoy's preconnect_policy opens upstream connections ahead of need); "
        "llama-server closes the connection after every streamed response although it answers Keep-Alive.  At "
        "most one spare per engine; a spare the engine closes unused is not replaced"
    )
    client_request_timeout_s: float = setting(
        60.0, "a whole request (headers and body) must arrive within 60 s of its first byte, else 408: nginx "
        "client_header_timeout / client_body_timeout default 60 s (slow-loris clients cannot hold connections)", gt=0
    )
    drain_timeout_s: float = setting(
        20.0, "on SIGTERM/SIGINT/SIGHUP the gateway stops listening and lets the requests and streams in flight "
        "finish for up to 20 s (a second signal stops at once), then cuts what is left: Kubernetes SIGKILLs 30 s "
        "after its SIGTERM (terminationGracePeriodSeconds), which leaves 10 s for the stop itself (embedded engines' "
        "5 s grace, the trace export's 2 s); nginx's graceful quit and uvicorn's --timeout-graceful-shutdown drain "
        "the same way.  A preStop sleep counts against the same 30 s.  0 cuts every stream at once", ge=0
    )
    reuse_port: bool = setting(
        False, "nginx's `listen ... reuseport` (Envoy's enable_reuse_port): SO_REUSEPORT on the listener, so a second "
        "gateway with a changed fleet file can listen on the same port while this one drains (start the new one, "
        "then SIGTERM the old: no connection refused, no stream cut; README \"Changing the fleet without dropping "
        "requests\").  Off: a second gateway on a port in use fails to start, which catches two deployments "
        "colliding"
    )
    client_idle_timeout_s: float = setting(
        75.0, "idle client keep-alive connections close after 75 s (nginx keepalive_timeout); a client that takes "
        "nothing of its answer (a stream, a long body) for as long is reset, cancelling its request (nginx "
        "send_timeout, 60 s, between two successive writes)", gt=0
    )
    max_client_connections: int = setting(
        8192, "Envoy's FAQ on file descriptor exhaustion: keep connection limits under half the process's fd limit "
        "(each client connection being served holds a second fd, its engine connection; the rest is for engine "
        "spares, scrapes, Redis, OTLP, logs): 8,192 under ~20,000 (`ulimit -n` of the reference machine) leaves "
        "~3,600; Envoy's global_downstream_max_connections / nginx's worker_connections bound the same.  At the "
        "bound a new connection first closes the keep-alive connection idle the longest (nginx does; never one with "
        "a request in flight), else it is answered 503 `overloaded` with Retry-After and closed, unread.  Lower it "
        "under a smaller fd limit (systemd's soft default is 1,024: the gateway warns at start)", ge=1
    )
    admin_key_sha256: str | None = setting(
        None, "no admin key: /metrics and /admin/* are open, like open tenant mode (said at startup); set the SHA-256 "
        "hex of a key to require `Authorization: Bearer <key>` (keys are stored only as hashes, like tenant keys)"
    )
    gc_freeze: bool = setting(
        True, "gc.freeze() once the process has started (Python docs, gc.freeze: 'freeze all the objects tracked by "
        "gc ... ignored by all future collections'; Instagram's pre-fork use): the ~117k objects of the imports, "
        "compiled kernels and fleet state leave the collector, whose full pass over them took 25 ms, a stall of "
        "every stream in flight"
    )
    gc_threshold0: int = setting(
        10_000, "young collections after 10,000 net new objects, not Python's 700 (Python 3.13 raised it to 2,000; "
        "the twin runs with 200,000): a served request leaves no reference cycle (tests/gateway/test_no_garbage.py), "
        "so what a young collection walks is the in-flight requests' live state, for nothing; measured at 64 streams "
        "over 2 engine-sims (2026-11-30, fourth session): 249 collections in 20 s, 1.5% of the gateway's CPU and "
        "pauses up to 12 ms at 700, none at 10,000 (a pass over 10,000 young objects takes ~1-3 ms when one runs)", ge=1
    )
    loop_lag_interval_s: float = setting(
        0.1, "steersman:event_loop_lag_seconds samples the event loop's lag every 100 ms: 10 timer wake-ups a "
        "second cost nothing measurable and a 15 s Prometheus scrape still sees ~150 samples (the interval of "
        "Node.js's perf_hooks.monitorEventLoopDelay default is 10 ms; a gateway needs less)", gt=0
    )
    busy_poll_s: float = setting(
        0.0, "HAProxy's `busy-polling` is off by default: a spinning event loop costs a core while traffic flows. "
        "> 0: the loop polls with a zero timeout instead of sleeping while requests are served and for this long "
        "after the last one, backing off while its core is contended (steersman.http.busypoll; e.g. 0.05 on a VM: "
        "added TTFT 0.63 -> 0.50 ms in bench/peers)"
    )
    isolate_tenant_caches: bool = setting(
        False, "vLLM shares prefix-cache blocks across all requests (a cache hit is a timing side channel between "
        "tenants); true adds a per-tenant `cache_salt` (vLLM's request field) at the cost of cross-tenant hits"
    )
    response_store_mib: int = setting(
        64, "design: the Responses API's stored responses (store: true, what previous_response_id continues) are "
        "kept in the gateway's memory up to 64 MiB, least recently used out first (OpenAI keeps them 30 days on "
        "its servers; a gateway keeps what a bounded heap holds: a few thousand long conversations)", ge=1
    )
    response_store: str | None = setting(
        None, "design: unset, stored responses are in `redis` when response_store_url is set, else in `memory`; a "
        "registered name (steersman.api.response_store.RESPONSE_STORES) picks another store"
    )
    response_store_url: str | None = setting(
        None, "design: stored responses stay in the gateway's memory; `redis://host:port/db` keeps them in Redis, "
        "shared by every gateway behind one load balancer (a conversation's next turn may reach another gateway)"
    )
    response_store_prefix: str = setting(
        "steersman:", "design: Redis keys of stored responses start with this, so several deployments (or test "
        "runs) share one Redis server without colliding"
    )
    response_store_ttl_s: float = setting(
        30 * 24 * 3600.0, "OpenAI's API keeps stored Response objects for 30 days by default (its data controls "
        "page); after that previous_response_id and GET /v1/responses/{id} no longer find them.  At most 10 years: "
        "Redis refuses a SET PX whose expiry time overflows (1e17 s failed every write)", gt=0, le=_TEN_YEARS_S
    )
    response_store_timeout_s: float = setting(
        1.0, "design: a Redis read of a stored response slower than 1 s fails (503, retryable) rather than holding "
        "the request: a local Redis answers in well under a millisecond", gt=0
    )
    limits_url: str | None = setting(
        None, "Kong's rate limiting keeps counters in each node's memory unless its policy names Redis (APISIX's "
        "limit-count likewise: local multiplies the quota by the instances): so do tenants' rate limits and spend "
        "here; `redis://host:port/db` shares them among every gateway naming it (each tenant's buckets and spend "
        "live in Redis, spend across restarts: steersman.state.shared_limits)"
    )
    limits_prefix: str = setting(
        "steersman:", "design: Redis keys of shared limits start with this (several deployments, or test runs, share "
        "one Redis server without colliding)"
    )
    limits_sync_s: float = setting(
        0.1, "Kong's Rate Limiting Advanced syncs its counters with Redis every sync_rate seconds (as low as 0.02 s); "
        "here every 100 ms, one Redis script per gateway for every tenant: the gateways together may admit what "
        "they each see within one sync over a limit", gt=0, le=60
    )
    limits_timeout_s: float = setting(
        1.0, "design: a sync with Redis slower than 1 s fails (the gateway goes on with its own limits until the "
        "next one) rather than growing a backlog of deltas in flight", gt=0
    )
    log_prompts: bool = setting(
        False, "prompts are user data: never logged unless asked (GDPR art. 5(1)(c) data minimisation); "
        "true logs request bodies at DEBUG"
    )
    max_sse_event_bytes: int = setting(
        1024 * 1024, "one streamed engine event (a token's chunk, ~300 B; tool-call or logprob chunks more): "
        "1 MiB bounds the gateway's buffer per stream; a longer event ends the stream with an error", ge=1
    )
    unhealthy_after_failures: int = setting(
        3, "consecutive failed scrapes before a replica is unhealthy: Kubernetes probe failureThreshold default 3", ge=1
    )

    otlp_traces_endpoint: str | None = setting(
        None, "tracing export is opt-in (vLLM's --otlp-traces-endpoint is too): an OTLP/HTTP traces URL, e.g. "
        "http://127.0.0.1:4318/v1/traces (the OpenTelemetry Collector's default port); without one the gateway "
        "passes the client's traceparent through to the engines and exports nothing"
    )
    trace_sample_ratio: float = setting(
        1.0, "OpenTelemetry's default sampler keeps every trace (ParentBased(ALWAYS_ON)); a ratio < 1 keeps that "
        "share of new traces (TraceIdRatioBased), a client's sampled flag still decides for its own", le=1
    )
    otlp_shutdown_timeout_s: float = setting(
        2.0, "design: at shutdown the gateway exports what is buffered for at most 2 s, then drops the rest (the "
        "SDK's batch processor would wait 30 s for a collector that is down: Kubernetes' whole default grace "
        "period)", gt=0
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        url = self.otlp_traces_endpoint
        problem = None if url is None else http_url_problem(url)
        if problem is not None:
            raise ValueError(f"otlp_traces_endpoint {problem}{' (OTLP/HTTP)' if problem.startswith('must') else ''}, "
                             f"got {shown(url)}")
        _check_host_and_keys(self)


def _check_host_and_keys(s: GatewaySettings) -> None:
    """What the gateway would otherwise find wrong only while starting (a traceback), or not at all: an empty host
    (asyncio listens on every interface), an admin key digest that is not one, a store URL redis-py cannot use."""
    if not s.host.strip():
        raise ValueError("host must be an address or a host name (an empty one listens on every interface)")
    key = s.admin_key_sha256
    if key is not None and not _is_sha256_hex(key.strip().lower()):  # what AdminGuard compares with
        raise ValueError("admin_key_sha256 must be the SHA-256 hex digest of the admin key (64 hex digits), "
                         "not the key itself")
    if s.response_store == "redis" and not s.response_store_url:
        raise ValueError("response_store 'redis' needs response_store_url (redis://host:port/db)")
    if s.response_store == "memory" and s.response_store_url:
        raise ValueError("response_store 'memory' keeps responses in this gateway: leave out response_store_url "
                         "(or name the store 'redis')")
    for name in ("response_store_url", "limits_url"):
        url = getattr(s, name)
        problem = redis_url_problem(url) if url else None
        if problem is not None:
            raise ValueError(f"{name} {problem}, got {shown(url)}")


def _is_sha256_hex(s: str) -> bool:
    return len(s) == 64 and all(c in "0123456789abcdef" for c in s)
