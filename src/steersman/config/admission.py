"""Settings of admission control: tenants, rate limits, workflows and the gateway queue."""

from __future__ import annotations

from dataclasses import dataclass

from steersman.config._base import check_bounds, setting, shown

__all__ = ["AdmissionSettings", "PRIORITY_CLASSES"]

#: steersman.policy.request.PriorityClass's names, lower-cased, most important first
PRIORITY_CLASSES = ("critical", "standard", "sheddable", "batch")


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    queue_max_entries: int = setting(
        1024, "Envoy cluster circuit breaker max_pending_requests default 1024: requests waiting for capacity.  At "
        "least 1: what the gateway queue takes (steersman.control.queue.GatewayQueue; 0 would be no queue, which "
        "it does not implement)", ge=1
    )
    rate_burst_s: float = setting(
        60.0,
        "token bucket capacity = one minute's worth of a tenant's per-minute limit, like Envoy's local rate limit "
        "token_bucket with max_tokens = tokens_per_fill and fill_interval 60 s (refilled continuously here)", gt=0,
    )
    open_tenant: str = setting("default", "issue #3: with no API keys configured every request is the 'default' tenant")
    default_priority: str = setting(
        "standard", "issue #3: a tenant (or open mode) that names no priority class gets the middle band 'standard'"
    )
    workflow_max_entries: int = setting(
        100_000, "bounded memory: 100k tracked workflows at ~0.8 KB each (ids of the longest allowed, 256 characters, "
        "costs recorded; measured, memory audit, 0.1 KB of it the per-tenant order of fair-share eviction) is ~80 MB; "
        "at the cap the least recently used of the tenant holding the most go first, so one tenant's flood of "
        "workflow ids evicts its own",
        ge=1,
    )
    workflow_idle_ttl_s: float = setting(
        3600.0,
        "a workflow idle for 1 h is forgotten: the longest prompt-cache TTL hosted APIs offer (Anthropic extended "
        "cache 1 h), after which resuming pays the full prefill again", gt=0,
    )
    workflow_id_max_chars: int = setting(256, "W3C Trace Context caps a tracestate value at 256 characters", ge=1)
    workflow_missed_demotion: int = setting(
        0, "off: a tenant's priority class is its contract.  Opt-in, in priority bands (1-3): once a call of a "
        "workflow has missed its SLO the task has failed (a task succeeds when all its calls meet theirs), and its "
        "later calls go that many bands lower (critical -> standard ...; never below batch), so under overload the "
        "capacity goes to tasks that can still succeed.  Twin, bench/policies' agentic mix at 8x its rate (~1.3x "
        "the fleet's capacity) for 180 s: successful tasks per $ 1,559 -> 1,580 with 1 band, 1,713 with 3 (the "
        "twenty-seventh session, tasks still under way at the end counted as unfinished; before, when they counted "
        "as successes, 2,155 -> 2,302 / 2,516); at 5x (~0.9x capacity) unchanged", le=3,
    )
    admitter: str = setting(
        "default", "steersman.control.admission.DefaultAdmitter: a tenant's budget, request and token buckets, then "
        "its requests in flight; another registered name (steersman.control.admission.ADMITTERS) replaces it, live "
        "and in the twin")

    def __post_init__(self) -> None:
        check_bounds(self)
        if self.default_priority.lower() not in PRIORITY_CLASSES:  # what PriorityClass.parse takes
            raise ValueError(f"default_priority must be a priority class, one of {', '.join(PRIORITY_CLASSES)}; "
                             f"got {shown(self.default_priority)}")
