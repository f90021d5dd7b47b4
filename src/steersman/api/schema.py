"""Typed OpenAI request bodies, decoded and validated with msgspec.

Decoding is strict about types (``max_tokens: "5"`` or ``true`` is an error that
names ``max_tokens``) and lenient about unknown fields, which are accepted and
forwarded to the engine untouched because the gateway forwards the original
bytes.  That is deliberate and consistent on every endpoint: OpenAI itself
rejects unknown parameters, but the engines behind the gateway take their own
extensions in the same body (vLLM's ``ignore_eos``, ``guided_json``,
``continue_final_message``; llama.cpp's ``cache_prompt``), and vLLM ignores what
it does not know, so the gateway does what the engine does.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from steersman.api.chat_checks import check_metadata, check_unsupported
from steersman.api.errors import ApiError, bad_request, json_error
from steersman.api.messages import check_message
from steersman.api.tools import chosen_tool
from steersman.config import DEFAULTS

__all__ = [
    "ChatMessage",
    "ChatCompletionRequest",
    "CompletionRequest",
    "StreamOptions",
    "decode_chat",
    "decode_completion",
    "body_headers_error",
    "content_type_error",
    "decode_with",
]


class StreamOptions(msgspec.Struct):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class _Common(msgspec.Struct, kw_only=True):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    user: str | None = None
    # sampling knobs with the same range on every engine kind (OpenAI's; vLLM's SamplingParams._verify_args): checked
    # here too, so each answers the same 400 naming the field (engine-sim samples greedily and ignores them)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # vLLM, llama.cpp
    min_p: float | None = None
    # not checked here, forwarded as sent: the engines disagree (llama.cpp takes logit_bias as [[token, bias]] pairs
    # or text keys, and a bias of false bans a token; any top_k <= 0 turns it off, vLLM refuses below -1)
    logit_bias: Any = None
    top_k: Any = None
    ignore_eos: bool = False
    priority: int = 0
    cache_salt: str | None = None  # vLLM: requests share prefix-cache blocks only with the same salt
    #: vLLM: k >= 1 keeps only the prompt's last k tokens (left truncation), -1 the model's context's worth
    truncate_prompt_tokens: int | None = None
    # what makes a stream's tokens depend on more than its text (no token-exact continuation): read in this one
    # decode, not checked (any JSON value; forwarded untouched like every field), None when absent
    guided_json: Any = None  # vLLM's guided decoding
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None  # vLLM's newer name for it
    grammar: Any = None  # llama.cpp
    json_schema: Any = None  # llama.cpp

    @property
    def guided(self) -> bool:
        """Constrained output was asked for (a grammar, a schema, a regular expression or a choice)."""
        return bool(self.guided_json or self.guided_regex or self.guided_choice or self.guided_grammar
                    or self.structured_outputs or self.grammar or self.json_schema)


class ChatCompletionRequest(_Common, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    continue_final_message: bool = False
    add_generation_prompt: bool = True
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None  # alternatives per token, up to GatewaySettings.max_logprobs; needs logprobs: true
    # OpenAI's, typed so a wrong type is a 400 naming it (forwarded as sent; api/chat_checks.py)
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    # what no engine behind the gateway does: refused (api/chat_checks.py), not answered as plain text
    modalities: Any = None
    audio: Any = None
    web_search_options: Any = None
    functions: Any = None
    function_call: Any = None

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)


class CompletionRequest(_Common, kw_only=True):
    prompt: str | list[str | int | list[int]]
    echo: bool = False
    logprobs: int | None = None  # alternatives per token (0: the chosen token's alone), up to max_logprobs
    suffix: str | None = None  # insertion after the output: engines judge it (vLLM and engine-sim refuse it)

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None


_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_AT = re.compile(r" - at `\$\.?([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def _param_of(msg: str) -> str | None:
    path = None
    m = _AT.search(msg)
    if m:
        path = m.group(1) or None
    missing = _MISSING.search(msg)
    if missing:
        field = missing.group(1)
        return f"{path}.{field}" if path else field
    return path


def _decode(decoder: msgspec.json.Decoder, body: bytes) -> Any:
    try:
        if not body.isascii():
            body.decode("utf-8")  # the typed decode skips the fields it does not know unread, and they are forwarded
        return decoder.decode(body)
    except msgspec.ValidationError as e:
        msg = str(e)
        param = _param_of(msg)
        text = _AT.sub("", msg)
        raise bad_request(f"Invalid request: {text}" + (f" (field `{param}`)" if param else ""), param) from None
    except msgspec.DecodeError as e:
        raise bad_request(f"Request body is not valid JSON: {json_error(e, body)}", None, "invalid_json") from None
    except UnicodeDecodeError:
        raise bad_request("Request body is not valid UTF-8.", None, "invalid_encoding") from None
    except RecursionError:
        raise bad_request("Request body is nested too deeply.", None, "invalid_json") from None


decode_with = _decode  # a body with another endpoint's decoder (its errors named as every endpoint's)


EMPTY_CACHE_SALT = "Parameter 'cache_salt' must be a non-empty string if provided."


def _check_common(req: _Common, limit_name: str, limit_value: int | None, max_tokens_limit: int) -> None:
    if not req.model:
        raise bad_request("`model` must be a non-empty string.", "model")
    if limit_value is not None:
        if limit_value < 1:
            raise bad_request(f"`{limit_name}` must be at least 1, got {limit_value}.", limit_name)
        if limit_value > max_tokens_limit:
            raise bad_request(
                f"`{limit_name}` is {limit_value}, more than the limit of {max_tokens_limit} tokens.", limit_name
            )
    if not 1 <= req.n <= 128:
        raise bad_request(f"`n` must be between 1 and 128, got {req.n}.", "n")
    if req.temperature is not None and not 0.0 <= req.temperature <= 2.0:
        raise bad_request(f"`temperature` must be between 0 and 2, got {req.temperature}.", "temperature")
    if req.top_p is not None and not 0.0 < req.top_p <= 1.0:
        raise bad_request(f"`top_p` must be in (0, 1], got {req.top_p}.", "top_p")
    _check_sampling(req)
    if req.stream_options is not None and not req.stream:
        raise bad_request("`stream_options` is only allowed when `stream` is true.", "stream_options")
    if isinstance(req.stop, list) and any(not isinstance(s, str) or not s for s in req.stop):
        raise bad_request("`stop` entries must be non-empty strings.", "stop")
    if req.stop == "":
        raise bad_request("`stop` must be a non-empty string or a list of them.", "stop")
    if req.cache_salt == "":  # vLLM's check_cache_salt_support: "" would salt nothing (llama.cpp does not check)
        raise bad_request(EMPTY_CACHE_SALT, "cache_salt")
    check_truncation(req.truncate_prompt_tokens)


def check_truncation(k: int | None) -> None:
    """vLLM's ``truncate_prompt_tokens``: an integer >= 1, or -1 (SamplingParams / PoolingParams ``_verify_args``)."""
    if k is not None and (k == 0 or k < -1):
        raise bad_request(f"`truncate_prompt_tokens` must be an integer >= 1 or -1, got {k}.", "truncate_prompt_tokens")


def _check_sampling(req: _Common) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        v = getattr(req, name)
        if v is not None and not -2.0 <= v <= 2.0:
            raise bad_request(f"`{name}` must be between -2 and 2, got {v}.", name)
    if req.repetition_penalty is not None and not 0.0 < req.repetition_penalty < math.inf:
        raise bad_request(f"`repetition_penalty` must be > 0, got {req.repetition_penalty}.", "repetition_penalty")
    if req.min_p is not None and not 0.0 <= req.min_p <= 1.0:
        raise bad_request(f"`min_p` must be between 0 and 1, got {req.min_p}.", "min_p")
    if req.seed is not None and not _INT64_MIN <= req.seed <= _INT64_MAX:  # vLLM's Field(ge=, le=) of a torch.long
        raise bad_request(f"`seed` must be a 64-bit signed integer, got {req.seed}.", "seed")


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def content_type_error(content_type: str | None) -> ApiError | None:
    """A JSON API: a body declared as something else is a 415 naming the header (no header: read as JSON)."""
    if content_type is None:
        return None
    media, _, params = content_type.partition(";")
    media = media.strip().lower()
    if media in ("", "application/json") or media.endswith("+json"):
        charset = next((v.strip().strip('"').lower() for k, _, v in (p.partition("=") for p in params.split(";"))
                        if k.strip().lower() == "charset"), None)
        # JSON is UTF-8 (RFC 8259 8.1) and read as such; a body declared in an encoding that is not even
        # ASCII-compatible (UTF-16/32) would only fail as "not valid JSON": say why instead
        if charset is None or not charset.replace("-", "").startswith(("utf16", "utf32", "ucs")):
            return None
        return ApiError(415, f"Header `Content-Type` declares charset {charset[:20]!r}: the body must be UTF-8 JSON.",
                        "invalid_request_error", "Content-Type", "unsupported_media_type")
    return ApiError(415, f"Header `Content-Type` must be application/json, got {content_type[:60]!r}.",
                    "invalid_request_error", "Content-Type", "unsupported_media_type")


def body_headers_error(headers: dict[str, str]) -> ApiError | None:
    """A body the gateway cannot read as it is declared: another media type, or encoded (gzip...): a 415 naming
    the header."""
    bad = content_type_error(headers.get("content-type"))
    if bad is None:
        coding = headers.get("content-encoding")
        if coding is not None and coding.strip().lower() not in ("", "identity"):
            bad = ApiError(415, f"Header `Content-Encoding` {coding[:40]!r} is not supported: send the body "
                           "unencoded.", "invalid_request_error", "Content-Encoding", "unsupported_media_type")
    return bad


def decode_chat(body: bytes, max_tokens_limit: int,
                max_logprobs: int = DEFAULTS.gateway.max_logprobs) -> ChatCompletionRequest:
    """Decode and validate a ``/v1/chat/completions`` body or raise :class:`ApiError`."""
    req: ChatCompletionRequest = _decode(_chat_decoder, body)
    if not req.messages:
        raise bad_request("`messages` must contain at least one message.", "messages")
    for i, m in enumerate(req.messages):
        if m.role not in _ROLES:
            raise bad_request(f"`messages[{i}].role` must be one of {', '.join(sorted(_ROLES))}, got {m.role[:40]!r}.",
                              f"messages[{i}].role")
        check_message(i, m.role, m.content, m.tool_calls, m.tool_call_id, m.name)
    name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    _check_common(req, name, req.output_limit, max_tokens_limit)
    if req.response_format is not None:
        _check_response_format(req.response_format)
    if req.tools is not None or req.tool_choice is not None:
        chosen_tool(req.tools, req.tool_choice)
    check_metadata(req.metadata)
    check_unsupported({"audio": req.audio, "web_search_options": req.web_search_options, "functions": req.functions,
                       "function_call": req.function_call, "modalities": req.modalities})
    if req.top_logprobs is not None:
        _check_logprobs(req.top_logprobs, "top_logprobs", max_logprobs)
        if req.top_logprobs and not req.logprobs:
            raise bad_request("`top_logprobs` needs `logprobs: true`.", "top_logprobs")
    return req


def decode_completion(body: bytes, max_tokens_limit: int,
                      max_logprobs: int = DEFAULTS.gateway.max_logprobs,
                      max_sequences: int = DEFAULTS.gateway.max_completion_sequences) -> CompletionRequest:
    """Decode and validate a ``/v1/completions`` body or raise :class:`ApiError`."""
    req: CompletionRequest = _decode(_completion_decoder, body)
    p = req.prompt
    prompts = 1
    if isinstance(p, list):
        if not p or (isinstance(p[0], list) and not p[0]):
            raise bad_request("`prompt` must not be empty.", "prompt")
        kinds = {type(x) for x in p}
        if len(kinds) != 1:
            raise bad_request("`prompt` must be a string, a list of strings, a list of token ids or a list of such lists.", "prompt")
        if isinstance(p[0], (str, list)):
            prompts = len(p)
    _check_common(req, "max_tokens", req.max_tokens, max_tokens_limit)
    if prompts * req.n > max_sequences:
        raise bad_request(f"`prompt` holds {prompts} prompts, each run `n` = {req.n} times: {prompts * req.n} "
                          f"sequences, more than the limit of {max_sequences} a request.", "prompt")
    if req.logprobs is not None:
        _check_logprobs(req.logprobs, "logprobs", max_logprobs)
    return req


#: ``response_format.type``: OpenAI's three and vLLM's ``structural_tag``
_FORMATS = ("text", "json_object", "json_schema", "structural_tag")


def _check_response_format(rf: dict[str, Any]) -> None:
    kind = rf.get("type")
    if kind not in _FORMATS:
        raise bad_request(f"`response_format.type` must be one of {', '.join(_FORMATS)}, got {str(kind)[:40]!r}.",
                          "response_format.type")
    if kind != "json_schema":
        return
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise bad_request("`response_format.json_schema` must be an object (with `name` and `schema`).",
                          "response_format.json_schema")
    if not isinstance(js.get("name"), str) or not js["name"]:
        raise bad_request("`response_format.json_schema.name` must be a non-empty string.",
                          "response_format.json_schema.name")
    if "schema" in js and not isinstance(js["schema"], (dict, bool)):
        raise bad_request("`response_format.json_schema.schema` must be a JSON Schema object.",
                          "response_format.json_schema.schema")
    for key, kind, what in (("strict", bool, "a boolean"), ("description", str, "a string")):
        if js.get(key) is not None and not isinstance(js[key], kind):
            raise bad_request(f"`response_format.json_schema.{key}` must be {what}.",
                              f"response_format.json_schema.{key}")


def _check_logprobs(k: int, field: str, most: int) -> None:
    if not 0 <= k <= most:
        raise bad_request(f"`{field}` must be between 0 and {most}, got {k}.", field)
