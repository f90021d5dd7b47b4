"""Per-request state carried through the stages of the request path."""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import Any

from steersman.api.schema import ChatCompletionRequest, CompletionRequest
from steersman.http.server import HttpRequest
from steersman.policy.request import SchedRequest

__all__ = ["RequestContext"]


@dataclass(slots=True, eq=False)
class RequestContext:
    http: HttpRequest
    kind: str  # "chat" | "completion"
    path: str  # upstream path, e.g. "/v1/chat/completions"
    seq: int
    started: float
    request: ChatCompletionRequest | CompletionRequest | None = None
    model: str = ""  # the model that serves it (brown-out may move it to a cheaper one)
    requested_model: str = ""  # the model the client asked for (set at parse: the trace's gen_ai.request.model)
    tenant: Any = None  # steersman.control.TenantConfig once authenticated
    sched: SchedRequest | None = None  # the typed scheduling context
    waiter: Any = None  # asyncio.Future while queued in the gateway
    started_at: Any = None  # steersman.control.accounting.Started once dispatched: settled exactly once
    ticket: Any = None  # steersman.fleet.state.Ticket: the replica's accounting for this request
    replica: int | None = None
    output_tokens: int = 0  # completion tokens relayed (counted or from usage)
    cached_tokens: int | None = None  # engine-reported prompt tokens served from its cache
    input_tokens: int | None = None  # a whole answer's engine-reported prompt tokens (read only for trace export)
    bytes_sent: bool = False  # body bytes reached the client: only continuation is allowed from here
    status: int = 0
    failed: bool = False  # the answer under way ended with an error event (``status`` stays the 200 sent)
    attempts: int = 0  # upstream attempts made (the runner's retry loop)
    excluded: set[int] = field(default_factory=set)  # replicas not to pick again for this request (they failed it)
    continuation: Any = None  # steersman.pipeline.continuation.Continuation once a stream started (H4)
    last_event_at: float | None = None  # when the stream's current leg last relayed an event (or began)
    request_id: str = ""  # X-Request-Id: the client's or a new one (steersman.obs.tracing.request_id)
    trace: Any = None  # the tracer's: the client's trace header lines (pass-through) or the request's span
    attempt_span: Any = None  # the tracer's span of the upstream attempt in progress (export on)

    @property
    def body(self) -> bytes:
        return self.http.body

    @property
    def stream(self) -> bool:
        return bool(self.request is not None and self.request.stream)
