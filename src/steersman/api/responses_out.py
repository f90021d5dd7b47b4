"""A chat completion's answer as a Response object, and a chat completion stream as the Responses stream events.

The events follow OpenAI's order: ``response.created``, ``response.in_progress``; per output item
``response.output_item.added``, (a message) ``response.content_part.added``, ``response.output_text.delta`` ...,
``response.output_text.done``, ``response.content_part.done``, (a function call)
``response.function_call_arguments.delta`` ..., ``response.function_call_arguments.done``; then
``response.output_item.done``; last ``response.completed`` (or ``response.incomplete`` at ``max_output_tokens``),
each numbered by ``sequence_number``.  An error event of the chat stream (the gateway's, once the stream cannot go
on) becomes an ``error`` event and ``response.failed``; so does a chunk the translation cannot read (the chat relay
passes what a chat client would take: the stream ends as a failure, not as a 500).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from steersman.api.responses import ResponsesCall, new_id

__all__ = ["ResponseBuilder", "ResponseEvents", "new_id"]

log = logging.getLogger(__name__)


def _count(v: Any) -> int:
    """A token count as the engine sent it; anything but a non-negative number reads as 0 (usage is reported,
    not checked: a chat client gets it as sent)."""
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 2**63 else 0


def _arguments(args: Any) -> str:
    """A tool call's arguments as JSON text (some engines send an object)."""
    return args if isinstance(args, str) else "" if args is None else orjson.dumps(args).decode()


def _usage(u: Any) -> dict[str, Any] | None:
    if not isinstance(u, dict):
        return None
    inp = _count(u.get("prompt_tokens"))
    out = _count(u.get("completion_tokens"))
    d = u.get("prompt_tokens_details")
    cached = d.get("cached_tokens") if isinstance(d, dict) else None
    return {"input_tokens": inp, "input_tokens_details": {"cached_tokens": _count(cached)},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": inp + out}


def _status(finish: str | None) -> tuple[str, dict[str, str] | None]:
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


class ResponseBuilder:
    """The Response object of one call: its id, the echoed request fields, and the assistant's chat message."""

    def __init__(self, call: ResponsesCall, model: str, created_at: int) -> None:
        self.call = call
        self.id = new_id("resp")
        self.model = model
        self.created_at = created_at

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                 incomplete: dict[str, str] | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "background": False, "error": error, "incomplete_details": incomplete, "model": self.model,
                "output": output, **self.call.echo, "usage": usage}

    def from_chat(self, body: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        """A whole chat completion (the engine's JSON) as a Response object, and the assistant message it adds."""
        doc = orjson.loads(body)
        choice = (doc.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        output: list[dict[str, Any]] = []
        text = msg.get("content")
        calls = []  # the call ids and arguments the Response shows are the ones the conversation keeps
        for c in msg.get("tool_calls") or ():
            fn = c.get("function") or {}
            calls.append({"id": c.get("id") or new_id("call"), "function": {
                "name": fn.get("name") or "", "arguments": _arguments(fn.get("arguments"))}})
        status, incomplete = _status(choice.get("finish_reason"))
        if text or not calls:
            # a cut answer ends in its last item: the message when no call follows it (as the stream closes them)
            whole = status == "completed" or bool(calls)
            output.append(_message_item(new_id("msg"), text or "", "completed" if whole else "incomplete"))
        for k, c in enumerate(calls):  # the answer cut (max_output_tokens) in its last call: that one is incomplete
            cut = status != "completed" and k == len(calls) - 1
            output.append(_call_item(new_id("fc"), c["id"], c["function"]["name"], c["function"]["arguments"],
                                     "incomplete" if cut else "completed"))
        return self.response(status, output, _usage(doc.get("usage")), incomplete), _assistant(text, calls)


def _message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def _assistant(text: str | None, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat message a later turn (``previous_response_id``) sends back for this output."""
    msg: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        msg["tool_calls"] = [{"id": c.get("id"), "type": "function", "function": c.get("function")} for c in calls]
    return msg


_DELTA = (b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":%d,'
          b'"item_id":"%b","output_index":%d,"content_index":0,"delta":%b,"logprobs":[]}\n\n')


def _payloads(data: bytes) -> list[bytes]:
    """The ``data`` payloads of the whole SSE events in ``data`` (what the gateway's relay writes)."""
    out = []
    for block in data.split(b"\n\n"):
        if block.startswith(b"data: ") and b"\n" not in block:  # one data line: the gateway's relay writes these
            out.append(block[6:])
            continue
        got = [ln[5:].lstrip(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
        if got:
            out.append(b"\n".join(got))
    return out


class ResponseEvents:
    """Turns the chat completion stream the gateway relays into the Responses stream, event by event."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self.b = builder
        self.seq = 0
        self.started = False
        self.finished = False
        self.items: list[dict[str, Any]] = []  # output items so far (their state as the events left it)
        self.text: list[str] = []  # the open message's text
        self.message: int | None = None  # output index of the open message item
        self.calls: dict[int, int] = {}  # chat tool-call index -> output index
        self.open_call: int | None = None
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.final: dict[str, Any] | None = None  # the Response object once complete
        self.assistant: dict[str, Any] | None = None  # the chat message it adds to the conversation

    def _ev(self, out: list[bytes], kind: str, **fields: Any) -> None:
        fields["type"] = kind
        fields["sequence_number"] = self.seq
        self.seq += 1
        out.append(b"event: %b\ndata: %b\n\n" % (kind.encode(), orjson.dumps(fields)))

    def feed(self, data: bytes) -> bytes:
        out: list[bytes] = []
        try:
            self._feed(data, out)
        except Exception as e:  # a chunk this cannot translate: the Response fails (its terminal event not yet sent)
            log.warning("a chat stream chunk could not be translated to Responses events (%r): response %s failed",
                        e, self.b.id)
            self._failed(out, {"code": "server_error", "message": "The engine's stream could not be translated "
                               "to Responses events."})
        return b"".join(out)

    def _feed(self, data: bytes, out: list[bytes]) -> None:
        for p in _payloads(data):
            if self.finished:
                break
            if p == b"[DONE]":
                self._complete(out)
                continue
            try:
                doc = orjson.loads(p)
            except orjson.JSONDecodeError:
                continue  # the gateway relays validated events only
            if not isinstance(doc, dict):
                continue
            self._start(out)
            if "error" in doc:
                self._failed(out, doc["error"] if isinstance(doc["error"], dict) else {"message": str(doc["error"])})
                continue
            if doc.get("usage"):
                self.usage = _usage(doc["usage"])
            for ch in doc.get("choices") or ():
                if ch.get("index", 0) == 0:  # a response is one answer (an engine's n > 1: the first only)
                    self._choice(out, ch)

    def _start(self, out: list[bytes]) -> None:
        if not self.started:
            self.started = True
            first = self.b.response("in_progress", [])
            self._ev(out, "response.created", response=first)
            self._ev(out, "response.in_progress", response=first)

    def _choice(self, out: list[bytes], ch: dict[str, Any]) -> None:
        delta = ch.get("delta") or {}
        text = delta.get("content")
        if text:
            self._close_call(out)
            if self.message is None:
                self.message = len(self.items)
                item = _message_item(new_id("msg"), None, "in_progress")
                self.items.append(item)
                self._ev(out, "response.output_item.added", output_index=self.message, item=item)
                self._ev(out, "response.content_part.added", item_id=item["id"], output_index=self.message,
                         content_index=0, part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
            self.text.append(text)
            # the stream's most frequent event, from a template (its fields in OpenAI's order)
            out.append(_DELTA % (self.seq, self.items[self.message]["id"].encode(), self.message, orjson.dumps(text)))
            self.seq += 1
        for tc in delta.get("tool_calls") or ():
            self._call_delta(out, tc)
        if ch.get("finish_reason"):
            self.finish = ch["finish_reason"]

    def _call_delta(self, out: list[bytes], tc: dict[str, Any]) -> None:
        k = tc.get("index", 0)
        fn = tc.get("function") or {}
        at = self.calls.get(k)
        if at is None:
            self._close_message(out)
            self._close_call(out)
            at = self.calls[k] = self.open_call = len(self.items)
            item = _call_item(new_id("fc"), tc.get("id") or new_id("call"), fn.get("name") or "", "", "in_progress")
            self.items.append(item)
            self._ev(out, "response.output_item.added", output_index=at, item=dict(item))
        item = self.items[at]
        if fn.get("name") and not item["name"]:
            item["name"] = fn["name"]
        args = _arguments(fn.get("arguments"))
        if args:
            item["arguments"] += args
            self._ev(out, "response.function_call_arguments.delta", item_id=item["id"], output_index=at, delta=args)

    def _close_message(self, out: list[bytes], status: str = "completed") -> None:
        i = self.message
        if i is None:
            return
        self.message = None
        item = self.items[i]
        text = "".join(self.text)
        self.text = []
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        self._ev(out, "response.output_text.done", item_id=item["id"], output_index=i, content_index=0, text=text,
                 logprobs=[])
        self._ev(out, "response.content_part.done", item_id=item["id"], output_index=i, content_index=0, part=part)
        item["content"] = [part]
        item["status"] = status
        self._ev(out, "response.output_item.done", output_index=i, item=item)

    def _close_call(self, out: list[bytes], status: str = "completed") -> None:
        i = self.open_call
        if i is None:
            return
        self.open_call = None
        item = self.items[i]
        self._ev(out, "response.function_call_arguments.done", item_id=item["id"], output_index=i,
                 name=item["name"], arguments=item["arguments"])
        item["status"] = status
        self._ev(out, "response.output_item.done", output_index=i, item=item)

    def _complete(self, out: list[bytes]) -> None:
        self._start(out)
        status, incomplete = _status(self.finish)
        if not self.items:  # an empty answer is still one (empty) message
            self.message = 0
            item = _message_item(new_id("msg"), None, "in_progress")
            self.items.append(item)
            self._ev(out, "response.output_item.added", output_index=0, item=item)
            self._ev(out, "response.content_part.added", item_id=item["id"], output_index=0, content_index=0,
                     part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        self._close_message(out, "completed" if status == "completed" else "incomplete")
        self._close_call(out, "completed" if status == "completed" else "incomplete")  # cut in its arguments
        self.finished = True
        self.final = self.b.response(status, self.items, self.usage, incomplete)
        calls = [{"id": it["call_id"], "function": {"name": it["name"], "arguments": it["arguments"]}}
                 for it in self.items if it["type"] == "function_call"]
        texts = [p["text"] for it in self.items if it["type"] == "message" for p in it["content"]]
        self.assistant = _assistant("".join(texts) if texts else None, calls)
        self._ev(out, "response.incomplete" if status == "incomplete" else "response.completed", response=self.final)

    def _failed(self, out: list[bytes], err: dict[str, Any]) -> None:
        self.finished = True
        code = err.get("code") if isinstance(err.get("code"), str) else "server_error"
        message = err.get("message") if isinstance(err.get("message"), str) else "The response failed."
        self._ev(out, "error", code=code, message=message, param=err.get("param"))
        self.final = self.b.response("failed", self.items, self.usage, None, {"code": code, "message": message})
        self._ev(out, "response.failed", response=self.final)
