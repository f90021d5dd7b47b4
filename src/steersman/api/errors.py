"""Errors in the OpenAI error format: ``{"error": {"message", "type", "param", "code"}}``.

Every refusal the gateway or the simulated engine sends goes through
:class:`ApiError`, so clients (including the official ``openai`` SDK) always get
a parseable body, the right status code and the field at fault.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import orjson

__all__ = [
    "ApiError",
    "bad_request",
    "not_found_model",
    "too_large",
    "unavailable",
    "upstream_failed",
    "sse_error_event",
    "error_body",
]


@dataclass(frozen=True, slots=True)
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry_after: float | None = None

    def payload(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body(self) -> bytes:
        return orjson.dumps(self.payload())

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

    def header_lines(self) -> bytes:
        """Extra response header lines (CRLF-terminated) for the raw HTTP server."""
        return b"".join(f"{k}: {v}\r\n".encode() for k, v in self.headers().items())


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


def not_found_model(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist or is not served by this gateway.",
        "invalid_request_error",
        "model",
        "model_not_found",
    )


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"Request body is larger than the limit of {limit} bytes.", "invalid_request_error", None, "request_too_large")


def unavailable(message: str, retry_after: float | None = 1.0, code: str = "no_capacity") -> ApiError:
    return ApiError(503, message, "server_error", None, code, retry_after)


def upstream_failed(message: str, status: int = 502, code: str = "upstream_error") -> ApiError:
    return ApiError(status, message, "server_error", None, code)


def error_body(status: int, message: str, code: str) -> bytes:
    """The body of a protocol-level error (404 route, 413 body, 400 malformed HTTP)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return ApiError(status, message, kind, None, code).body()


def sse_error_event(err: ApiError) -> bytes:
    """An SSE event carrying an error, for failures after a stream has started."""
    return b"data: " + err.body() + b"\n\n"
