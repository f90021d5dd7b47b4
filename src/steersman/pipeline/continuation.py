"""Token-exact continuation of a stream whose engine failed mid-response.

While a stream is relayed, :class:`Continuation` keeps what continuing it needs
and nothing more: the first chunk's ``id`` / ``created`` / ``model``, the text
emitted so far, the number of token events, the finish reason, whether a tool
call or logprobs appeared, and any usage the engine reported.  It also
validates every event (malformed JSON ends the stream with an error event).

If the engine dies after *k* tokens, :meth:`Continuation.request_body` is the
request for another replica: the chat with the emitted text as a final
assistant message continued in place (vLLM's ``continue_final_message: true,
add_generation_prompt: false``; llama.cpp treats a final assistant message as
a prefill too), or the completion prompt with the text appended, with the
remaining ``max_tokens``.  The new replica's events are rewritten
(:meth:`Continuation.rewrite`) so the client sees one stream: no second role
chunk, the first replica's ``id`` / ``created`` / ``model``, and a ``usage``
that counts the original prompt and every token emitted.

Where continuing could change the answer it is refused (``allowed`` False, with
``reason``): ``n`` > 1, logprobs, guided / JSON output, token-id or echoed
prompts, and a tool call in progress.
"""

from __future__ import annotations

from typing import Any

import msgspec

from steersman.api.schema import ChatCompletionRequest, CompletionRequest
from steersman.engines.sse import DONE
from steersman.pipeline.continuation_legs import Legs

__all__ = ["Continuation", "BadEvent", "refusal_reason"]


class BadEvent(ValueError):
    """An engine event that is not an OpenAI stream chunk (``good``: the valid events before it)."""

    def __init__(self, message: str, good: int = 0) -> None:
        super().__init__(message)
        self.good = good


class _Delta(msgspec.Struct):
    role: Any = None
    content: str | None = None
    tool_calls: Any = None
    function_call: Any = None
    reasoning_content: Any = None  # vLLM's reasoning parsers (and DeepSeek's API)
    reasoning: Any = None  # vLLM >= 0.10's name for it


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None
    logprobs: Any = None


class _Chunk(msgspec.Struct):
    id: Any = None
    created: Any = None
    model: Any = None
    choices: list[_Choice] = []
    usage: Any = None
    error: Any = None


_decode = msgspec.json.Decoder(_Chunk).decode
_decode_str = msgspec.json.Decoder(str).decode


def refusal_reason(req: ChatCompletionRequest | CompletionRequest) -> str | None:
    """Why a stream of ``req`` could not be continued token-exactly (None: it can be)."""
    if req.n != 1:
        return "n > 1"
    if req.wants_logprobs:
        return "logprobs"
    if req.guided:
        return "guided output"
    if isinstance(req, ChatCompletionRequest):
        rf = req.response_format or {}
        if rf.get("type") not in (None, "text"):
            return "structured output (response_format)"
        return None
    if req.echo:
        return "echo"
    p = req.prompt
    if isinstance(p, list) and not (len(p) == 1 and isinstance(p[0], str)):
        return "a token-id or multiple prompt"
    return None


class Continuation(Legs):
    """The emitted-so-far state of one stream (``ctx.continuation``)."""

    __slots__ = ("chat", "allowed", "reason", "id", "created", "model", "texts", "tokens", "leg_start",
                 "finish_reason", "usage", "usage_sent", "done", "legs", "include_usage", "limit", "prompt_tokens",
                 "last_sent", "_body", "_head", "_fh", "_ft", "_stops", "_tail", "_leg_text", "stopped")

    def __init__(self, req: ChatCompletionRequest | CompletionRequest, body: bytes, prompt_tokens: int | None) -> None:
        self.chat = isinstance(req, ChatCompletionRequest)
        self._body = body  # the client's request: every continuation is built from it
        self.reason = refusal_reason(req)
        self.allowed = self.reason is None
        self.id = self.created = self.model = None
        self.texts: list[str] = []
        self.tokens = 0  # token events relayed, all legs
        self.leg_start = 0  # tokens relayed before the current leg
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.usage_sent = False  # an event with usage reached the client (the end of a stream sends no second one)
        self.done = False
        self.legs = 0  # replicas that served this stream so far
        self.last_sent: float | None = None  # when the last leg's last event was written to the client
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self.limit = req.output_limit
        self.prompt_tokens = prompt_tokens  # the original prompt's tokens, when the gateway knows them exactly
        self._head: tuple[Any, Any, Any] | None = None
        self._fh = self._ft = b""  # a plain token event's bytes around its text (see _learn)
        # stop strings a continuation leg's first text may complete across the failover (Legs.rewrite)
        self._stops: tuple[tuple[str, ...], bool] | None = None  # (stop strings, include_stop_str_in_output)
        self._tail = self._leg_text = ""
        self.stopped = False  # the gateway ended the stream on a stop string the failover split

    # ---- relaying ------------------------------------------------------------------------------
    @property
    def text(self) -> str:
        if len(self.texts) > 1:
            self.texts = ["".join(self.texts)]
        return self.texts[0] if self.texts else ""

    @property
    def remaining(self) -> int | None:
        return None if self.limit is None else self.limit - self.tokens

    def output_tokens(self) -> int:
        """The stream's output tokens: the engine's own ``usage`` where it reported one on a stream served by one
        replica, else the token events relayed (a tool call's first event, its id and name, carries no token: an
        observability audit found tool-call streams counted one token over the engine's usage, in the span and in
        the tenant's token refund)."""
        u = self.usage
        n = u.get("completion_tokens") if isinstance(u, dict) and self.legs <= 1 else None
        return n if type(n) is int and n >= 0 else self.tokens

    def observe(self, payload: bytes) -> None:
        """Validate and record one event of the first leg (relayed unchanged)."""
        self.observe_many((payload,))

    def observe_many(self, payloads: list[bytes] | tuple[bytes, ...], leg: bool = False) -> int:
        """Validate and record first-leg events up to ``[DONE]``; how many were taken.

        The relay's hot path (one call per engine read): kept flat on purpose.
        A bad event raises :class:`BadEvent` with ``good`` = the events before it.
        """
        n = 0
        chat = self.chat
        texts = self.texts
        fh, ft = self._fh, self._ft
        for payload in payloads:
            if fh and payload.startswith(fh) and payload.endswith(ft):
                try:  # same bytes as a validated plain token event around one JSON string: valid iff it is
                    text = _decode_str(payload[len(fh) : len(payload) - len(ft)])
                except (msgspec.DecodeError, UnicodeDecodeError):
                    pass  # the full check below says what is wrong
                else:
                    if text:
                        texts.append(text)
                    self.tokens += 1
                    n += 1
                    continue
            if payload == DONE:
                self.done = True
                return n + 1
            try:
                c = _decode(payload)
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as e:
                raise BadEvent(f"the engine sent an event that is not an OpenAI chunk ({e}): {payload[:80]!r}", n) from None
            if c.error is not None:
                raise BadEvent(f"the engine reported an error mid-stream: {str(c.error)[:200]}", n)
            if not leg:
                if self._head is None:
                    self._head = (c.id, c.created, c.model)
                    self.id, self.created, self.model = self._head
                if c.usage is not None:
                    self.usage = c.usage
                    self.usage_sent = True
            for ch in c.choices:
                if ch.index or ch.logprobs is not None:
                    self._refuse("n > 1" if ch.index else "logprobs")
                if ch.finish_reason is not None:
                    self.finish_reason = ch.finish_reason
                if chat:
                    d = ch.delta
                    if d is None:
                        continue
                    if d.tool_calls or d.function_call:
                        self._refuse("a tool call in progress")
                    if d.reasoning_content or d.reasoning:  # continued as content, the reasoning would start over
                        self._refuse("reasoning in progress")
                    if d.content:
                        texts.append(d.content)
                    if d.role is None:
                        self.tokens += 1
                elif ch.text is not None:
                    texts.append(ch.text)
                    self.tokens += 1
            if not fh and not leg and self.allowed and c.usage is None and len(c.choices) == 1:
                fh, ft = self._learn(payload, c.choices[0])
            n += 1
        return n

    def _learn(self, payload: bytes, ch: _Choice) -> tuple[bytes, bytes]:
        """From a plain token event (one choice, text only, not finished), the bytes around its text.

        Every later event with the same bytes around one valid JSON string is the
        same kind of event: it is then recorded without decoding the whole chunk.
        """
        if ch.index or ch.finish_reason is not None or ch.logprobs is not None:
            return b"", b""
        if self.chat:
            d = ch.delta
            if (d is None or d.role is not None or d.tool_calls or d.function_call or d.content is None
                    or d.reasoning_content is not None or d.reasoning is not None):
                return b"", b""
            key, text = b'"content":', d.content
        else:
            if ch.text is None:
                return b"", b""
            key, text = b'"text":', ch.text
        i = payload.find(key)
        if i < 0 or payload[i + len(key) : i + len(key) + 1] != b'"':
            return b"", b""
        start = i + len(key)
        j = payload.find(b'"', start + 1)
        while j > 0:  # the first quote not escaped (an odd run of backslashes before it escapes it)
            k = j
            while payload[k - 1] == 0x5C:  # backslash
                k -= 1
            if (j - k) % 2 == 0:
                break
            j = payload.find(b'"', j + 1)
        if j < 0:
            return b"", b""
        end = j + 1
        try:
            if _decode_str(payload[start:end]) != text:
                return b"", b""
        except msgspec.DecodeError:
            return b"", b""
        self._fh, self._ft = payload[:start], payload[end:]
        return self._fh, self._ft

    def _refuse(self, reason: str) -> None:
        if self.allowed:
            self.allowed, self.reason = False, reason
