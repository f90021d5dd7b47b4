"""Errors in the OpenAI error format: ``{"error": {"message", "type", "param", "code"}}``.

Every refusal the gateway or the simulated engine sends goes through
:class:`ApiError`, so clients (including the official ``openai`` SDK) always get
a parseable body, the right status code and the field at fault.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import orjson

__all__ = [
    "ApiError",
    "bad_request",
    "json_error",
    "not_found_model",
    "unauthorized",
    "too_large",
    "unavailable",
    "upstream_failed",
    "sse_error_event",
    "error_body",
    "engine_error_body",
    "refused_with_5xx",
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
        if self.retry_after is None or not math.isfinite(self.retry_after):
            return {}  # (never: a retry that cannot succeed; a refusal names no time then)
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

    def header_lines(self) -> bytes:
        """Extra response header lines (CRLF-terminated) for the raw HTTP server."""
        return b"".join(f"{k}: {v}\r\n".encode() for k, v in self.headers().items())


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


def unauthorized(why) -> ApiError:
    """The 401 of a request whose API key was refused (``why``: a :class:`steersman.control.tenants.AuthError`)."""
    return ApiError(why.status, why.message, "invalid_request_error", None, why.code)


def not_found_model(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model[:64]}{'...' if len(model) > 64 else ''}` does not exist or is not served by this gateway.",
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


_CONTEXT_WORDS = ("context length", "context size")  # vLLM: "maximum context length"; llama.cpp: "... context size"
# llama-server answers 500 for requests it cannot take whatever the replica's state, where vLLM answers 400 (tools
# without --jinja; an image or audio part without a multimodal projector: server-common.cpp of llama.cpp 0.3.36)
_REFUSED_5XX = (b"input is not supported", b"requires --jinja")


def refused_with_5xx(status: int, body: bytes) -> bool:
    """An engine's 5xx that refuses the request itself (what it asks for, not the replica's health): a 501 Not
    Implemented (llama-server's ``not_supported_error``: embeddings without ``--embeddings``; a llama.cpp audit:
    14 such calls ejected both healthy replicas, each 501 counted as a failure and retried), or one of
    llama-server's 500s for input it cannot take."""
    return status == 501 or (status == 500 and any(w in body for w in _REFUSED_5XX))


def engine_error_body(status: int, body: bytes, field: str | None) -> bytes:
    """An engine's own 4xx answer in the OpenAI error format the gateway promises.

    Engines refuse in their own shapes: llama.cpp ``{"error": {"code": 400, "message", "type":
    "exceed_context_size_error", ...}}`` (a numeric code, no ``param``), vLLM ``{"object": "error", "message",
    "type": "BadRequestError", "param", "code": 400}`` (older releases, not nested) or ``{"error": {...}}`` with a
    numeric code.  The message and the engine's own extra fields are kept; ``code`` becomes a string (the
    engine's own string code, else ``context_length_exceeded`` for a request over the context -- OpenAI's code,
    ``param`` then the prompt's ``field`` -- else the engine's error type); ``type`` is OpenAI's for the status.
    An engine's 5xx refusal of the request itself (:func:`refused_with_5xx`), relayed as a 400, gets
    ``unsupported_value`` and ``field``.  A body that is already in the format comes back unchanged."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str) \
            and isinstance(err["type"], str) and all(err[k] is None or isinstance(err[k], str) for k in ("param", "code")):
        return body
    if not isinstance(err, dict):
        err = doc if isinstance(doc, dict) and "message" in doc else {}
    message = err.get("message")
    if not isinstance(message, str) or not message:
        text = body[:300].decode("utf-8", "replace").strip()
        message = f"The engine refused the request ({status}){': ' + text if text else ''}."
    extra = {k: v for k, v in err.items() if k not in ("message", "type", "param", "code", "object")}
    code, param = err.get("code"), err.get("param")
    kind = err.get("type")
    if not isinstance(code, str):
        lowered = message.lower()
        if kind == "exceed_context_size_error" or any(w in lowered for w in _CONTEXT_WORDS):
            code = "context_length_exceeded"
            param = param if isinstance(param, str) else field
        elif status >= 500:  # a refusal relayed as a 400 (refused_with_5xx): what the request asks for is unsupported
            code, param = "unsupported_value", param if isinstance(param, str) else field
        else:
            code = kind if isinstance(kind, str) and kind else None
    out = {"message": message, "type": "rate_limit_error" if status == 429 else "invalid_request_error",
           "param": param if isinstance(param, str) else None, "code": code}
    return orjson.dumps({"error": out | extra})


#: a ``\uD800``-``\uDBFF`` escape (not itself escaped) that no low-surrogate escape follows
_LONE_HIGH = re.compile(rb"(?<!\\)(?:\\\\)*\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u)")


def json_error(e: Exception, body: bytes) -> str:
    """What msgspec's decode error ``e`` of ``body`` says, with its one misleading case put right: a lone high
    surrogate escape (``"a\\ud800b"``) reads "Input data was truncated" for a body that is whole."""
    text = str(e)
    if "truncated" in text and _LONE_HIGH.search(body):
        return "JSON is malformed: invalid utf-16 surrogate pair (a \\uD800-\\uDBFF escape without its low half)"
    return text
