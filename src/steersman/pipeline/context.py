"""Per-request state carried through the stages of the request path."""

from __future__ import annotations

from dataclasses import dataclass

from steersman.api.schema import ChatCompletionRequest, CompletionRequest
from steersman.http.server import HttpRequest

__all__ = ["RequestContext"]


@dataclass(slots=True, eq=False)
class RequestContext:
    http: HttpRequest
    kind: str  # "chat" | "completion"
    path: str  # upstream path, e.g. "/v1/chat/completions"
    seq: int
    started: float
    request: ChatCompletionRequest | CompletionRequest | None = None
    model: str = ""
    replica: int | None = None
    bytes_sent: bool = False  # body bytes reached the client: only continuation is allowed from here
    status: int = 0

    @property
    def body(self) -> bytes:
        return self.http.body

    @property
    def stream(self) -> bool:
        return bool(self.request is not None and self.request.stream)
