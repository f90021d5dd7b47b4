"""OpenAI's Responses API (``POST /v1/responses``) served over the engines' chat completions.

A Responses request becomes one chat completion request that runs the gateway's whole request path (admission,
prefix-aware scheduling, retries, token-exact stream continuation); its answer is turned back into a Response
object or the Responses stream events (:mod:`steersman.api.responses_out`).  llama.cpp's server does the same
conversion inside the engine (``server_chat_convert_responses_to_chatcmpl``, which refuses
``previous_response_id``); doing it in the gateway serves every engine kind alike, and the gateway keeps the
conversations itself (:mod:`steersman.api.response_store`), so ``previous_response_id`` works whichever replica
served the earlier turn.

The translation is stateless and checked as OpenAI checks it: a wrong input item, tool or format is a 400 naming
it (``input[2].call_id``, ``tools[0].name``, ``text.format.type``).  Fields the chat request does not know are
forwarded into it untouched, as the gateway forwards unknown fields everywhere (engines' own extensions such as
``top_k``); fields of the Responses API that change what is asked and that the gateway cannot do (``background``,
``conversation``, ``prompt`` templates, hosted tools) are refused, not ignored.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from steersman.api.chat_checks import check_metadata
from steersman.api.errors import ApiError, bad_request, json_error
from steersman.api.responses_checks import check_own as _check_own, check_tool_pairs as _check_tool_pairs
from steersman.api.responses_checks import kind as _kind, reasoning_echo as _reasoning_echo, str_field as _str
from steersman.api.tools import check_function_fields

__all__ = ["ResponsesCall", "translate_request", "chat_param", "input_items", "new_id"]

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
# what OpenAI's API takes and the gateway turns into the chat request itself (the rest is forwarded as it came)
_OWN = frozenset({"model", "input", "instructions", "max_output_tokens", "stream", "store", "previous_response_id",
                  "metadata", "tools", "tool_choice", "text", "parallel_tool_calls", "temperature", "top_p", "user",
                  "truncation", "include", "reasoning", "service_tier", "safety_identifier", "prompt_cache_key",
                  "prompt_cache_retention", "stream_options", "max_tool_calls", "top_logprobs", "background",
                  "conversation", "prompt", "n", "best_of"})
# asked for, not doable here: refused with a 400 naming the field (a silent drop would change the answer)
_REFUSED = {
    "background": "background responses are not supported by this gateway: omit it, or stream instead",
    "conversation": "the Conversations API is not supported by this gateway: chain turns with previous_response_id",
    "prompt": "stored prompt templates are not supported by this gateway: send the input itself",
    "top_logprobs": "log probabilities are not supported on /v1/responses by this gateway: use /v1/chat/completions",
}


_VERBOSITY = ("low", "medium", "high")


@dataclass(slots=True)
class ResponsesCall:
    """One Responses request, translated: the chat body to run and what the Response object echoes."""

    chat: dict[str, Any]  # the chat completion request
    echo: dict[str, Any]  # the request fields a Response object repeats (instructions, tools, ...)
    history: list[dict[str, Any]]  # the conversation's chat messages without the instructions (kept with the output)
    stream: bool = False
    store: bool = True
    previous: str | None = None  # previous_response_id
    metadata: dict[str, str] = field(default_factory=dict)
    input_items: list[dict[str, Any]] = field(default_factory=list)  # the input as items with ids (input_items list)

    def chat_body(self, skip: int = 0) -> bytes:
        """The chat request, its conversation less the ``skip`` oldest messages (``truncation: auto``)."""
        if not skip:
            return orjson.dumps(self.chat)
        head = self.chat["messages"][: len(self.chat["messages"]) - len(self.history)]  # the instructions, if any
        return orjson.dumps({**self.chat, "messages": head + self.history[skip:]})

    def skips(self) -> list[int]:
        """How many of the conversation's oldest messages each attempt drops: none, then (``truncation: auto``)
        1, 2, 4 ... of its earlier turns and last all of them but the newest.  A cut is at a user turn, so a tool's
        output never loses the call it answers."""
        if self.echo.get("truncation") != "auto":
            return [0]
        cuts = [i for i, m in enumerate(self.history) if i > 0 and m.get("role") == "user"]
        tries = [0] + [cuts[min(2**k, len(cuts)) - 1] for k in range(len(cuts).bit_length() + 1)] if cuts else [0]
        return list(dict.fromkeys(tries))


def _content(parts: Any, where: str, role: str) -> str | list[dict[str, Any]]:
    """A message's content in chat form: a string as it is, a single text part as its text, parts as chat parts."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise bad_request(f"Invalid type for '{where}': expected a string or an array of content parts, "
                          f"but got {_kind(parts)}.", where, "invalid_type")
    out: list[dict[str, Any]] = []
    for j, p in enumerate(parts):
        at = f"{where}[{j}]"
        if not isinstance(p, dict):
            raise bad_request(f"Invalid type for '{at}': expected an object, but got {_kind(p)}.", at, "invalid_type")
        kind = p.get("type")
        if kind in ("input_text", "output_text", "text", "refusal"):
            key = "refusal" if kind == "refusal" else "text"
            text = _str(p, key, f"{at}.{key}", required=True)
            out.append({"type": "text", "text": text})
        elif kind == "input_image":
            url = p.get("image_url")
            if not isinstance(url, str):
                raise bad_request(f"'{at}': only images given by image_url (a URL or a data URL) are supported by "
                                  "this gateway (no file_id: it has no Files API).", f"{at}.image_url", "unsupported_value")
            image: dict[str, Any] = {"url": url}
            if isinstance(p.get("detail"), str):
                image["detail"] = p["detail"]
            out.append({"type": "image_url", "image_url": image})
        elif isinstance(kind, str):
            raise bad_request(f"Content parts of type '{kind}' are not supported by this gateway ('{at}'): text and "
                              "images are.", f"{at}.type", "unsupported_value")
        else:
            raise bad_request(f"Missing required parameter: '{at}.type'.", f"{at}.type", "missing_required_parameter")
    if len(out) == 1 and out[0]["type"] == "text":
        return out[0]["text"]
    return out


_STATUSES = ("in_progress", "completed", "incomplete")  # an input item's (OpenAI's ResponseInputItem)


def _messages(items: Any) -> list[dict[str, Any]]:
    """``input`` (a string, or a list of items) as chat messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise bad_request(f"Invalid type for 'input': expected a string or an array of input items, but got "
                          f"{_kind(items)}.", "input", "invalid_type")
    out: list[dict[str, Any]] = []
    for i, it in enumerate(items):
        at = f"input[{i}]"
        if not isinstance(it, dict):
            raise bad_request(f"Invalid type for '{at}': expected an object, but got {_kind(it)}.", at, "invalid_type")
        kind = it.get("type", "message" if "role" in it else None)
        _str(it, "id", f"{at}.id")  # kept as the item's id (input_items lists it; its `after` takes a string)
        status = it.get("status")
        if status is not None and status not in _STATUSES:
            raise bad_request(f"Invalid value for '{at}.status': {str(status)[:40]!r}. Supported values are: "
                              "'in_progress', 'completed' and 'incomplete'.", f"{at}.status", "invalid_value")
        if kind == "message":
            role = _str(it, "role", f"{at}.role", required=True)
            if role not in _ROLES:
                raise bad_request(f"Invalid value for '{at}.role': '{role}'. Supported values are: 'user', "
                                  "'assistant', 'system' and 'developer'.", f"{at}.role")
            if "content" not in it:
                raise bad_request(f"Missing required parameter: '{at}.content'.", f"{at}.content",
                                  "missing_required_parameter")
            out.append({"role": _ROLES[role], "content": _content(it["content"], f"{at}.content", role)})
        elif kind == "function_call":
            call = {"id": _str(it, "call_id", f"{at}.call_id", required=True), "type": "function",
                    "function": {"name": _str(it, "name", f"{at}.name", required=True),
                                 "arguments": _str(it, "arguments", f"{at}.arguments", required=True)}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                # a turn's text and calls (a replayed output: message, function_call ...): one assistant message
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _str(it, "call_id", f"{at}.call_id", required=True)
            if "output" not in it:
                raise bad_request(f"Missing required parameter: '{at}.output'.", f"{at}.output", "missing_required_parameter")
            output = _content(it["output"], f"{at}.output", "tool")
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            continue  # a reasoning model's summary of an earlier turn: not part of a chat conversation
        elif isinstance(kind, str):
            raise bad_request(f"Input items of type '{kind}' are not supported by this gateway ('{at}'): messages, "
                              "function_call and function_call_output are.", f"{at}.type", "unsupported_value")
        else:
            raise bad_request(f"Missing required parameter: '{at}.type'.", f"{at}.type", "missing_required_parameter")
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise bad_request(f"Invalid type for 'tools': expected an array, but got {_kind(tools)}.", "tools", "invalid_type")
    out = []
    for i, t in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(t, dict):
            raise bad_request(f"Invalid type for '{at}': expected an object, but got {_kind(t)}.", at, "invalid_type")
        kind = t.get("type")
        if kind != "function":
            raise bad_request(f"Tools of type '{kind}' are not supported by this gateway ('{at}'): it serves "
                              "function tools, which your code runs.", f"{at}.type", "unsupported_value")
        name = _str(t, "name", f"{at}.name", required=True)
        if not name:  # here, not in the chat check behind: that one words its advice in the chat tool's shape
            raise bad_request(f"'{at}.name' must be a non-empty string.", f"{at}.name", "empty_string")
        fn: dict[str, Any] = {"name": name}
        for key in ("description", "parameters", "strict"):
            if t.get(key) is not None:
                fn[key] = t[key]
        check_function_fields(fn, at)
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice  # none / auto / required (anything else: the chat check names tool_choice)
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": _str(choice, "name", "tool_choice.name", required=True)}}
    kind = choice.get("type") if isinstance(choice, dict) else None
    raise bad_request(f"tool_choice {orjson.dumps(choice).decode()[:80]} is not supported by this gateway: "
                      "'none', 'auto', 'required' or {'type': 'function', 'name': ...} are"
                      + (f" (not '{kind}')." if kind else "."), "tool_choice", "unsupported_value")


def _text_format(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, dict):
        raise bad_request(f"Invalid type for 'text': expected an object, but got {_kind(text)}.", "text", "invalid_type")
    verbosity = text.get("verbosity")
    if verbosity is not None and verbosity not in _VERBOSITY:
        raise bad_request(f"Invalid value for 'text.verbosity': {str(verbosity)[:40]!r}. Supported values are: 'low', "
                          "'medium' and 'high'.", "text.verbosity", "invalid_value")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad_request(f"Invalid type for 'text.format': expected an object, but got {_kind(fmt)}.",
                          "text.format", "invalid_type")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {"name": _str(fmt, "name", "text.format.name", required=True)}
        if not isinstance(fmt.get("schema"), dict):
            raise bad_request("Missing required parameter: 'text.format.schema' (an object).", "text.format.schema",
                              "missing_required_parameter")
        for key in ("schema", "strict", "description"):
            if fmt.get(key) is not None:
                schema[key] = fmt[key]
        return {"type": "json_schema", "json_schema": schema}
    raise bad_request(f"Invalid value for 'text.format.type': {kind!r}. Supported values are: 'text', 'json_object' "
                      "and 'json_schema'.", "text.format.type")


def translate_request(body: bytes | dict[str, Any], history: list[dict[str, Any]] | None = None) -> ResponsesCall:
    """The chat completion request for a Responses request's ``body`` (or the document :func:`parse_body` made of
    it: not parsed twice); ``history``: the chat messages of the conversation ``previous_response_id`` names
    (looked up by the caller, after :func:`previous_id`)."""
    doc = body if isinstance(body, dict) else parse_body(body)
    for key, why in _REFUSED.items():
        v = doc.get(key)
        if v is None or v is False or (key == "top_logprobs" and type(v) is int and v == 0):
            continue  # (not `in (None, False)`: 0 == False, and `background: 0` went by as "off")
        raise bad_request(f"'{key}': {why}.", key, "unsupported_value")
    _check_own(doc)
    for key in ("n", "best_of"):  # OpenAI's Responses API has none: one answer per response
        v = doc.get(key)
        if v is not None and (type(v) is not int or v != 1):
            raise bad_request(f"'{key}': a response is one answer (OpenAI's Responses API has no '{key}'): omit it, "
                              "or send several requests.", key, "unsupported_value")
    model = _str(doc, "model", "model", required=True)
    if "input" not in doc:
        raise bad_request("Missing required parameter: 'input'.", "input", "missing_required_parameter")
    turn = _messages(doc["input"])
    if not turn:
        raise bad_request("'input' is empty: give a string or at least one input item.", "input", "empty_array")
    instructions = _str(doc, "instructions", "instructions")
    conversation = list(history or ()) + turn
    _check_tool_pairs(history or (), doc["input"])
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    chat: dict[str, Any] = {k: v for k, v in doc.items() if k not in _OWN}  # engine extensions, as sent
    chat["model"] = model
    chat["messages"] = messages
    stream = False if doc.get("stream") is None else doc["stream"]  # (an explicit null: the default, as OpenAI)
    if not isinstance(stream, bool):
        raise bad_request(f"Invalid type for 'stream': expected a boolean, but got {_kind(stream)}.", "stream", "invalid_type")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # for the usage of response.completed
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("user", "user"), ("parallel_tool_calls", "parallel_tool_calls")):
        if doc.get(src) is not None:
            chat[dst] = doc[src]  # their types and ranges: checked by the chat request's own checks (names mapped back)
    tools = _tools(doc["tools"]) if doc.get("tools") is not None else []
    if tools:
        chat["tools"] = tools
    # OpenAI's Responses API takes "auto" / "none" without tools (chat, as vLLM, refuses a tool_choice without tools)
    if doc.get("tool_choice") is not None and (tools or doc["tool_choice"] not in ("auto", "none")):
        chat["tool_choice"] = _tool_choice(doc["tool_choice"])
    fmt = _text_format(doc["text"]) if doc.get("text") is not None else None
    if fmt is not None:
        chat["response_format"] = fmt
    store = True if doc.get("store") is None else doc["store"]
    if not isinstance(store, bool):
        raise bad_request(f"Invalid type for 'store': expected a boolean, but got {_kind(store)}.", "store", "invalid_type")
    metadata = doc.get("metadata")
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise bad_request("Invalid type for 'metadata': expected an object of string values.", "metadata", "invalid_type")
    check_metadata(metadata)
    truncation = doc.get("truncation")
    truncation = "disabled" if truncation is None else truncation
    if truncation not in ("auto", "disabled"):
        raise bad_request(f"Invalid value for 'truncation': {truncation!r}. Supported values are: 'auto' and 'disabled'.",
                          "truncation")
    echo = {"instructions": instructions, "max_output_tokens": doc.get("max_output_tokens"),
            "temperature": doc.get("temperature"), "top_p": doc.get("top_p"),
            "tool_choice": doc.get("tool_choice") if doc.get("tool_choice") is not None else "auto",
            "tools": doc.get("tools") or [], "parallel_tool_calls": doc.get("parallel_tool_calls", True),
            "text": doc.get("text") or {"format": {"type": "text"}}, "truncation": truncation,
            "user": doc.get("user"), "reasoning": _reasoning_echo(doc), "store": store,
            "previous_response_id": doc.get("previous_response_id"), "metadata": metadata}
    return ResponsesCall(chat, echo, conversation, stream, store, doc.get("previous_response_id"), metadata,
                         input_items(doc["input"]))


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def input_items(items: Any) -> list[dict[str, Any]]:
    """``input`` (already checked) as OpenAI lists it back (``GET /v1/responses/{id}/input_items``): items with ids,
    a message's text as content parts."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    out = []
    for it in items:
        kind = it.get("type", "message")
        item = {"type": kind, **{k: v for k, v in it.items() if k != "type"}}
        if kind == "message":
            part = "output_text" if it["role"] == "assistant" else "input_text"
            if isinstance(it["content"], str):
                item["content"] = [{"type": part, "text": it["content"]}]
            item.setdefault("status", "completed")
        item.setdefault("id", new_id(_ITEM_PREFIX.get(kind, "item")))
        out.append(item)
    return out


#: levels the gateway adds around the request's values when it writes them again (the chat request's tool
#: ``function``, a stored response's record, an event's ``response``): orjson writes at most 254 in all
_WRAPPING = 4


def _wrapped(doc: Any) -> Any:
    for _ in range(_WRAPPING):
        doc = [doc]
    return doc


def parse_body(body: bytes) -> dict[str, Any]:
    try:
        doc = msgspec.json.decode(body)  # (orjson reads 1,024 levels but writes 254, and reads big integers as floats)
        orjson.dumps(_wrapped(doc))  # what cannot be written again is refused now, not after the engine answered
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"We could not parse the JSON body of your request: {json_error(e, body)}.", "invalid_request_error",
                       None, "invalid_json") from None
    except (RecursionError, TypeError) as e:
        why = "has a number out of range" if "Integer" in str(e) else "is nested too deeply"
        raise ApiError(400, f"We could not parse the JSON body of your request: it {why}.",
                       "invalid_request_error", None, "invalid_json") from None
    if not isinstance(doc, dict):
        raise bad_request(f"The request body must be a JSON object, not {_kind(doc)}.", None, "invalid_type")
    return doc


def previous_id(doc: dict[str, Any]) -> str | None:
    return _str(doc, "previous_response_id", "previous_response_id")


_PARAMS = (("max_completion_tokens", "max_output_tokens"), ("max_tokens", "max_output_tokens"),
           ("messages", "input"), ("response_format.json_schema", "text.format"), ("response_format", "text.format"))


def chat_param(param: str | None) -> str | None:
    """The Responses request's name for a chat request's field named in an error (``messages[3].content`` ->
    ``input``: the instructions and the conversation before shift the indices, so the whole input is named)."""
    if not param:
        return param
    for chat, own in _PARAMS:
        if param == chat or param.startswith(chat + ".") or param.startswith(chat + "["):
            return own if chat == "messages" else own + param[len(chat):]
    if param.startswith("tools[") and ".function." in param:
        return param.replace(".function.", ".", 1)
    if param.startswith("tool_choice.function."):
        return "tool_choice." + param[len("tool_choice.function."):]
    return param
