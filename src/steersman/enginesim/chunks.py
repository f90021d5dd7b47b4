"""OpenAI response bodies as the simulated engine sends them (vLLM's shapes).

Streaming chunks are assembled from pre-encoded byte templates so a token costs
one ``orjson.dumps`` of its text.
"""

from __future__ import annotations

import orjson

__all__ = ["ChunkWriter", "full_response", "usage_of"]


def usage_of(prompt_tokens: int, completion_tokens: int, cached: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


class ChunkWriter:
    """Byte templates of one request's SSE events (``chat`` or ``completion``)."""

    __slots__ = ("chat", "_head", "_mid_open", "_mid_lp", "_tail", "_base")

    def __init__(self, chat: bool, rid: str, created: int, model: str) -> None:
        self.chat = chat
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._base = {"id": rid, "object": obj, "created": created, "model": model}
        head = orjson.dumps(self._base)[:-1]  # without the closing brace
        if chat:
            self._head = b"data: " + head + b',"choices":[{"index":0,"delta":{"content":'
            self._mid_lp = b'},"logprobs":'
        else:
            self._head = b"data: " + head + b',"choices":[{"index":0,"text":'
            self._mid_lp = b',"logprobs":'
        self._mid_open = self._mid_lp + b'null,"finish_reason":'
        self._tail = b"}]}\n\n"

    def role(self, index: int = 0) -> bytes:
        """vLLM's first chat chunk (of each choice): the assistant role with empty content."""
        d = dict(self._base, choices=[{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                       "finish_reason": None}])
        return b"data: " + orjson.dumps(d) + b"\n\n"

    def token(self, text: str, finish_reason: str | None = None) -> bytes:
        fr = b"null" if finish_reason is None else orjson.dumps(finish_reason)
        return self._head + orjson.dumps(text) + self._mid_open + fr + self._tail

    def event(self, index: int, text: str, finish_reason: str | None, logprobs: dict | None) -> bytes:
        """A token event of choice ``index`` (``n`` > 1), with its log probabilities when asked for."""
        fr = b"null" if finish_reason is None else orjson.dumps(finish_reason)
        head = self._head.replace(b'"index":0', b'"index":%d' % index, 1) if index else self._head
        lp = b"null" if logprobs is None else orjson.dumps(logprobs)
        return head + orjson.dumps(text) + self._mid_lp + lp + b',"finish_reason":' + fr + self._tail

    def tool_start(self, call_id: str, name: str, index: int = 0) -> bytes:
        """vLLM's first tool-call event (of choice ``index``): the call's id and function, no arguments yet."""
        call = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        return self._choice({"tool_calls": [call]}, None, index)

    def tool_args(self, text: str, finish_reason: str | None = None, index: int = 0) -> bytes:
        """A piece of the tool call's arguments (of choice ``index``)."""
        return self._choice({"tool_calls": [{"index": 0, "function": {"arguments": text}}]}, finish_reason, index)

    def _choice(self, delta: dict, finish_reason: str | None, index: int = 0) -> bytes:
        d = dict(self._base, choices=[{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}])
        return b"data: " + orjson.dumps(d) + b"\n\n"

    @staticmethod
    def with_usage(event: bytes, prompt_tokens: int, completion_tokens: int) -> bytes:
        """``event`` (one chunk) carrying vLLM's continuous usage stats (``stream_options.continuous_usage_stats``):
        the tokens of its choice so far."""
        return event[:-3] + b',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\n' % (
            prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)

    def usage(self, usage: dict) -> bytes:
        return b"data: " + orjson.dumps(dict(self._base, choices=[], usage=usage)) + b"\n\n"

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"


def full_response(chat: bool, rid: str, created: int, model: str, choices: list[tuple[str, str, dict | None]],
                  usage: dict, tools: list[tuple[str, str] | None] | None = None) -> bytes:
    """The whole answer; ``choices``: (text, finish reason, logprobs or None) of each sample, in index order;
    ``tools``: each choice's (call id, function name) when it is a tool call whose arguments are its text."""
    if chat:
        out = [{"index": i, "message": {"role": "assistant", "content": text, "tool_calls": []}, "logprobs": lp,
                "finish_reason": reason} for i, (text, reason, lp) in enumerate(choices)]
        for choice, tool in zip(out, tools or ()):
            if tool is not None:
                msg = choice["message"]
                msg["tool_calls"] = [{"id": tool[0], "type": "function", "function": {"name": tool[1], "arguments": msg["content"]}}]
                msg["content"] = None
        obj = "chat.completion"
    else:
        out = [{"index": i, "text": text, "logprobs": lp, "finish_reason": reason}
               for i, (text, reason, lp) in enumerate(choices)]
        obj = "text_completion"
    return orjson.dumps({"id": rid, "object": obj, "created": created, "model": model, "choices": out, "usage": usage})
