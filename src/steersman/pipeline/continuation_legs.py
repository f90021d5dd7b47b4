"""Continuation legs: the request that resumes a stream, and its events as the client must see them.

A mixin of :class:`steersman.pipeline.continuation.Continuation` (kept apart so
each module stays small): what happens after an engine failed mid-stream.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from steersman.engines.sse import DONE

__all__ = ["Legs"]


class Legs:
    """Continuing a stream on another replica (state lives in ``Continuation``)."""

    __slots__ = ()

    def request_body(self) -> bytes:
        """The request that continues this stream on another replica.

        The body is read member by member as raw JSON (msgspec ``Raw``): what the gateway forwards untouched (an
        unknown field holding ``1e999`` or an integer past 64 bits, which the typed decode skipped) is written
        back byte for byte, and only the members rewritten here are decoded."""
        body = msgspec.json.decode(self._body, type=dict[str, msgspec.Raw])
        text = self.text
        rem = self.remaining
        if self.chat:
            messages = msgspec.json.decode(body["messages"], type=list[msgspec.Raw])
            prefill = _value(body, "continue_final_message") and messages
            last = msgspec.json.decode(messages[-1]) if prefill else None
            if isinstance(last, dict) and last.get("role") == "assistant":
                messages[-1] = _extended(last, text)  # the client's own prefill: the answer goes on in it
            else:
                messages.append({"role": "assistant", "content": text})
            body["messages"] = messages
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
            key = "max_completion_tokens" if _value(body, "max_completion_tokens") is not None else "max_tokens"
        else:
            p = _value(body, "prompt")
            body["prompt"] = p + text if isinstance(p, str) else [p[0] + text]
            key = "max_tokens"
        if rem is not None:
            body[key] = rem
        min_tokens = _value(body, "min_tokens")
        if isinstance(min_tokens, int):  # what is left of it (vLLM refuses min_tokens > max_tokens)
            body["min_tokens"] = max(0, min_tokens - self.tokens)
        keep = _value(body, "truncate_prompt_tokens")
        if isinstance(keep, int) and keep > 0:  # the engine keeps the prompt's last k tokens: the emitted text too
            body["truncate_prompt_tokens"] = keep + self.tokens
        body["stream"] = True
        options = _value(body, "stream_options")
        # usage, to report the whole stream's at its end; the client's other options kept (continuous_usage_stats)
        body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        return msgspec.json.encode(body)

    def begin_leg(self) -> None:
        """A replica starts serving this stream (the first, or a continuation)."""
        self.legs += 1
        self.leg_start = self.tokens
        if self.legs > 1:
            if self._stops is None:
                body = msgspec.json.decode(self._body, type=dict[str, msgspec.Raw])
                stop = _value(body, "stop")
                stops = (stop,) if isinstance(stop, str) else tuple(x for x in stop or () if isinstance(x, str) and x)
                self._stops = (stops, bool(_value(body, "include_stop_str_in_output")))
            longest = max(map(len, self._stops[0]), default=0)
            # the emitted text's end that a stop string may begin in and this leg's text end (the new engine
            # matches only its own output: "... than this" + " of" never matched "this of")
            self._tail = self.text[max(0, len(self.text) - longest + 1):] if longest > 1 else ""
            self._leg_text = ""

    def _straddled(self, text: str) -> str | None:
        """This leg's next ``text`` against the stop strings begun before the failover: None if none completes in
        it, else what of ``text`` the client gets (up to the stop string's end when it is to be included, else up
        to its start: the engine would have held back its beginning, as vLLM does while a stop string may form)."""
        tail, before = self._tail, self._leg_text
        window = tail + before + text
        n = len(tail)
        best = None
        for stop in self._stops[0]:  # type: ignore[index]
            i = window.find(stop, max(0, n - len(stop) + 1))
            while 0 <= i < n:  # begins before the failover; ends in this leg
                end = i + len(stop)
                if end > n and (best is None or end < best[1]):
                    best = (i, end)
                    break
                i = window.find(stop, i + 1)
        if best is None:
            self._leg_text = before + text
            if len(self._leg_text) >= max(map(len, self._stops[0])) - 1:  # type: ignore[index]
                self._tail = ""  # no stop string begun before the failover can end past here: the engine's own now
            return None
        cut = (best[1] if self._stops[1] else best[0]) - n - len(before)  # type: ignore[index]
        return text[: max(0, cut)]

    def rewrite(self, payload: bytes) -> bytes | None:
        """A continuation leg's event as the client must see it (None: drop it)."""
        if payload == DONE:
            self.done = True
            return payload
        self.observe_leg(payload)
        obj = orjson.loads(payload)
        if self._head is not None:
            for k, v in zip(("id", "created", "model"), self._head):
                if k in obj:
                    obj[k] = v
        choices = obj.get("choices") or []
        role_chunk = False
        for ch in choices:
            d = ch.get("delta") if isinstance(ch, dict) else None
            if isinstance(d, dict) and "role" in d:
                del d["role"]
                role_chunk = True
        if role_chunk and all(_empty_chat_choice(ch) for ch in choices) and obj.get("usage") is None:
            return None  # the continuation's own role chunk: the client already had one
        if self._tail and len(choices) == 1 and isinstance(choices[0], dict):
            self._stop_across(choices[0])
        usage = obj.get("usage")
        if usage is not None:
            obj["usage"] = self.whole_usage(usage)
            if not choices and not self.include_usage:
                return None
            self.usage_sent = True
        elif "usage" in obj and not self.include_usage:
            del obj["usage"]
        return orjson.dumps(obj)

    def _stop_across(self, ch: dict) -> None:
        """End the stream at a stop string the failover split (its text cut, finish ``stop``; ``stopped``)."""
        d = ch.get("delta") if self.chat else None
        holder, key = (d, "content") if self.chat else (ch, "text")
        text = holder.get(key) if isinstance(holder, dict) else None
        if not isinstance(text, str) or not text:
            return
        kept = self._straddled(text)
        if kept is None:
            return
        holder[key] = kept
        ch["finish_reason"] = self.finish_reason = "stop"
        if self.texts and self.texts[-1] == text:  # (what observe_leg recorded: the client gets ``kept``)
            self.texts[-1] = kept
        self.stopped = True

    def observe_leg(self, payload: bytes) -> None:
        """Validate and record a continuation leg's event (its own head and usage are not the stream's)."""
        self.observe_many((payload,), leg=True)

    def whole_usage(self, leg_usage: dict) -> dict:
        """The usage of the whole stream from a continuation leg's usage."""
        u = dict(leg_usage)
        leg_completion = int(u.get("completion_tokens") or 0)
        prompt = self.prompt_tokens
        if prompt is None:  # the engine counted the emitted text as prompt: take it back out
            prompt = max(0, int(u.get("prompt_tokens") or 0) - self.leg_start)
        u["prompt_tokens"] = prompt
        u["completion_tokens"] = self.leg_start + leg_completion
        u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
        return u

    def closing_events(self, prompt_estimate: int | None = None) -> bytes:
        """End a stream locally when nothing is left to generate (the engine died after its last token).

        ``prompt_estimate``: the gateway's count of the prompt, for ``usage`` when no exact one is known.
        """
        out = b""
        if self.finish_reason is None:
            self.finish_reason = "length"
            ch: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
            if self.chat:
                ch["delta"] = {}
            else:
                ch["text"] = ""
            out += _event(self._chunk([ch]))
        if self.include_usage and not self.usage_sent:  # (an engine dying between its usage and [DONE] sent it)
            prompt = self.prompt_tokens
            if prompt is None and isinstance(self.usage, dict):
                prompt = self.usage.get("prompt_tokens")
            if prompt is None:
                prompt = prompt_estimate or 0
            usage = {"prompt_tokens": prompt, "completion_tokens": self.tokens, "total_tokens": prompt + self.tokens}
            out += _event(self._chunk([], usage))
        self.done = True
        return out + b"data: [DONE]\n\n"

    def _chunk(self, choices: list, usage: dict | None = None) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        d = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            d["usage"] = usage
        return d


def _value(body: dict, key: str) -> Any:
    """Member ``key`` of a body read as raw members, decoded (None when absent)."""
    raw = body.get(key)
    return None if raw is None else msgspec.json.decode(raw) if isinstance(raw, msgspec.Raw) else raw


def _extended(message: dict, text: str) -> dict:
    """The client's final assistant message (a prefill) with ``text`` appended to its content."""
    content = message.get("content")
    if isinstance(content, list):  # content parts: the text goes on in the last text part, or a new one
        parts = list(content)
        if parts and isinstance(parts[-1], dict) and parts[-1].get("type") == "text":
            parts[-1] = {**parts[-1], "text": (parts[-1].get("text") or "") + text}
        else:
            parts.append({"type": "text", "text": text})
        return {**message, "content": parts}
    return {**message, "content": (content or "") + text}


def _event(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _empty_chat_choice(ch: Any) -> bool:
    if not isinstance(ch, dict) or ch.get("finish_reason") is not None:
        return False
    d = ch.get("delta") or {}
    return not d.get("content") and not d.get("tool_calls") and set(d) <= {"content"}
