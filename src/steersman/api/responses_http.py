"""``/v1/responses`` on the gateway: create (whole or streamed), retrieve and delete.

A create runs as a chat completion through the gateway's request path, with :class:`ResponsesHttp` standing in for
the client's HTTP request: the stages read the chat body from it, and what they answer (a whole completion, stream
events, an error) is written to the client as the Responses API's (:mod:`steersman.api.responses_out`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import parse_qs

import orjson

from steersman.api.errors import ApiError, bad_request, unauthorized, upstream_failed
from steersman.api.headers import tag_request_id
from steersman.api.response_store import ResponseStore, StoreUnavailable, StoredCorrupt, make_response_store
from steersman.api.responses import chat_param, parse_body, previous_id, translate_request
from steersman.api.responses_out import ResponseBuilder, ResponseEvents
from steersman.api.schema import body_headers_error
from steersman.control.tenants import AuthError
from steersman.http.server import HttpRequest
from steersman.obs.histogram import CounterFamily
from steersman.obs.tracing import CallSpan

__all__ = ["ResponsesHttp", "ResponsesEndpoints"]

log = logging.getLogger(__name__)


def _mapped_error(body: bytes) -> bytes:
    """An OpenAI error body with its ``param`` named as the Responses request names it."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("param"), str):
        return body
    mapped = chat_param(err["param"])
    if mapped == err["param"]:
        return body
    param, before, after = err["param"], _top(err["param"]), _top(mapped)
    err["param"] = mapped
    if isinstance(err.get("message"), str) and before != after:  # "`max_tokens` must be ..." names it too
        msg = err["message"].replace(f"`{param}`", f"`{mapped}`").replace(f"'{param}'", f"'{mapped}'")
        err["message"] = msg.replace(f"`{before}`", f"`{after}`").replace(f"'{before}'", f"'{after}'")
    return orjson.dumps(doc)


def _top(param: str) -> str:
    return re.match(r"[A-Za-z_]*", param).group(0)  # type: ignore[union-attr]


def _inner(name: str, writable: bool = False) -> property:
    """An attribute of the client's request (``self.inner``), read (and written) through."""
    def get(self):
        return getattr(self.inner, name)

    def put(self, value) -> None:
        setattr(self.inner, name, value)

    return property(get, put if writable else None)


class ResponsesHttp:
    """The client's request as the request path sees it (the chat body), answering in the Responses API."""

    __slots__ = ("inner", "body", "builder", "events", "on_done", "hold", "held", "write", "tail", "call_span")

    def __init__(self, inner: HttpRequest, builder: ResponseBuilder, chat_body: bytes,
                 on_done: Callable[[dict[str, Any], dict[str, Any]], Awaitable[None] | None],
                 hold_context_error: bool = False, call_span: CallSpan | None = None) -> None:
        self.inner = inner
        self.body = chat_body
        self.builder = builder
        self.events = ResponseEvents(builder)
        # (the Response object, the assistant's chat message) once it completed; returns its store write, if any
        self.on_done = on_done
        self.hold = hold_context_error  # a refusal for the context's length is kept, not sent (to try shorter)
        self.held: bytes | None = None
        self.write: Awaitable[None] | None = None  # the stored response's write the answer's last bytes wait for
        self.tail: list[Callable[[], None]] = []  # what is written to the client once it landed (:meth:`flush`)
        self.call_span = call_span  # the call's one SERVER span over its tries (trace export on; else None)

    # what the stages read of the request: the client's own
    headers = _inner("headers")
    method = _inner("method")
    path = _inner("path")
    closed = _inner("closed")
    client_paused = _inner("client_paused")
    extra_headers = _inner("extra_headers", writable=True)
    producer = _inner("producer", writable=True)  # the engine exchange paused while the client cannot keep up

    @property
    def started(self) -> bool:
        return self.inner.started or bool(self.tail)  # a held whole answer is an answer

    def withdraw(self) -> bool:
        return not self.tail and self.inner.withdraw()  # a held answer is not taken back for an error

    async def drain(self) -> None:
        await self.inner.drain()

    def served_by(self, model: str) -> None:
        """Brown-out moved the call to ``model``: the Response (sent and stored) names the model that answered,
        as a chat completion does, not the one asked for."""
        self.builder.model = model

    # what they answer
    def respond(self, status: int, body: bytes, content_type: bytes = b"application/json", extra: bytes = b"") -> None:
        if status == 200:
            try:
                response, assistant = self.builder.from_chat(body)
            except (ValueError, TypeError, AttributeError, KeyError):  # not a chat completion (orjson's errors are ValueErrors)
                err = upstream_failed("The engine's answer is not a chat completion: "
                                      + body[:200].decode("utf-8", "replace"), 502, "malformed_response")
                self.inner.respond(err.status, err.body(), content_type, extra)
                return
            self.write = self.on_done(response, assistant)
            body = orjson.dumps(response)
            if self.write is not None:
                self.tail.append(partial(self.inner.respond, status, body, content_type, extra))
                return
        else:
            if self.hold and status == 400 and b'"context_length_exceeded"' in body:
                self.held = body
                return
            body = _mapped_error(body)
        self.inner.respond(status, body, content_type, extra)

    def start_stream(self, status: int = 200, content_type: bytes = b"text/event-stream", extra: bytes = b"",
                     hold: bool = False) -> None:
        self.inner.start_stream(status, content_type, extra, hold)

    def send(self, data: bytes, last: bool = False) -> None:
        ev = self.events
        out = ev.feed(data) if data else b""
        if ev.final is not None and ev.assistant is not None and ev.final["status"] != "failed":
            self.write = self.on_done(ev.final, ev.assistant)
            ev.assistant = None  # once
        if self.write is not None:  # the final event and what follows it: once the write landed
            self.tail.append(partial(self.inner.send, out, last))
            return
        self.inner.send(out, last)

    def end_stream(self) -> None:
        self.send(b"", True)

    async def flush(self, bound: Callable[[], Awaitable[None]]) -> None:
        """Write what waits for the stored response's write: once it landed, or failed, or ``bound()`` returned."""
        if self.write is None:
            return
        timer = asyncio.ensure_future(bound())
        try:
            await asyncio.wait({asyncio.ensure_future(self.write), timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        tail, self.tail, self.write = self.tail, [], None
        for write in tail:
            write()


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"No response found with id '{response_id}'.", "invalid_request_error", None, "not_found")


def _store_down(op: str = "read") -> ApiError:
    """503 for a store that failed (the cause is logged by the store: its server's address is not the client's)."""
    what = "deleted" if op == "delete" else "read"
    return ApiError(503, f"Stored responses cannot be {what} right now: the response store is unavailable",
                    "server_error", None, "store_unavailable", 1.0)


class ResponsesEndpoints:
    """The Gateway's Responses endpoints (a mixin: it uses the gateway's tenants, settings, clock and ``_handle``)."""

    response_store: ResponseStore

    def _route_responses(self) -> None:
        self.store_ops = CounterFamily("steersman:response_store_operations", "Stored responses written, read and "
                                       "deleted by outcome (error: the store, e.g. Redis, failed; corrupt: a record it did not write, answered as not found).", ["op", "outcome"])
        self.metrics.registry.register(self.store_ops)
        self.response_store = make_response_store(self.settings, self.clock, self.store_ops.inc)
        self.http.route("POST", "/v1/responses", self.responses)
        self.http.route("GET", "/v1/responses/", self.get_response)
        self.http.route("DELETE", "/v1/responses/", self.delete_response)

    def _tenant_or_refuse(self, request: HttpRequest) -> str | None:
        got = self.tenants.authenticate(request.headers.get("authorization"))
        if isinstance(got, AuthError):
            err = unauthorized(got)
            request.respond(err.status, err.body())
            return None
        return got.name

    async def responses(self, request: HttpRequest) -> None:
        rid = tag_request_id(request)
        tenant = self._tenant_or_refuse(request)  # a request without a valid key is refused before its body is read
        bad = body_headers_error(request.headers) if tenant is not None else None
        if bad is not None:
            request.respond(bad.status, bad.body())
        if tenant is None or bad is not None:
            self.metrics.count("_unknown", bad.status if bad is not None else 401)
            return
        try:
            doc = parse_body(request.body)
            history = None
            prev = previous_id(doc)
            if prev is not None:
                stored = await self._stored(tenant, prev)
                if stored is None:
                    raise ApiError(400, f"Previous response with id '{prev}' not found.", "invalid_request_error",
                                   "previous_response_id", "previous_response_not_found")
                history = list(stored.conversation)
            call = translate_request(doc, history)
        except ApiError as e:
            request.respond(e.status, e.body(), extra=e.header_lines())
            self.metrics.count("_unknown", e.status)
            return
        request.extra_headers = b""  # _handle tags it again (the same id)
        request.headers["x-request-id"] = rid
        store = self.response_store

        def done(response: dict[str, Any], assistant: dict[str, Any]) -> Awaitable[None] | None:
            if call.store:
                try:
                    return store.put(tenant, response, call.history + [assistant], call.input_items)
                except Exception:  # (a bug) keeping it must not cost the client the response being sent
                    log.exception("response %s could not be stored", response.get("id"))
                    self.store_ops.inc("write", "error")
            return None

        builder = ResponseBuilder(call, call.chat["model"], int(self.clock.wall()))
        # truncation "auto": a conversation over the context is sent again without its oldest turns, dropping 1, 2,
        # 4 ... of them (a few attempts, each refused before any prefill), until it fits or only the newest is left
        skips = call.skips()
        # the held tries are not answers: with trace export on, the call is one SERVER span (the tries a count on it)
        span = CallSpan() if self.tracer.exporting and len(skips) > 1 else None
        for n, skip in enumerate(skips):
            builder.model = call.chat["model"]  # (brown-out may have moved a held try, and not this one)
            sink = ResponsesHttp(request, builder, call.chat_body(skip), done, n < len(skips) - 1, span)
            await self.chat(sink)  # type: ignore[arg-type]
            if sink.held is None:
                # its last bytes once its write landed (a store with IO): the client's next turn, sent at once to
                # any gateway, finds it; a slow store delays the answer by at most response_store_timeout_s
                await sink.flush(lambda: self.clock.sleep(self.settings.response_store_timeout_s))
                return

    async def _stored(self, tenant: str, response_id: str):
        try:
            got = await self.response_store.get(tenant, response_id)
        except StoreUnavailable:
            self.store_ops.inc("read", "error")
            raise _store_down() from None
        except StoredCorrupt:
            self.store_ops.inc("read", "corrupt")
            return None
        self.store_ops.inc("read", "found" if got is not None else "missing")
        return got

    async def get_response(self, request: HttpRequest) -> None:
        """``GET /v1/responses/{id}``, and ``.../input_items`` (OpenAI's list: ``order`` desc by default, ``limit``
        1-100 (20), ``after`` an item id)."""
        items = request.path.endswith("/input_items")
        if items:
            request.path = request.path[: -len("/input_items")]
        got = await self._by_id(request, self.response_store.get, "read")
        if got is None:
            return
        if not items and _asks_stream(request.query):  # (streaming a stored response is for background ones)
            err = bad_request("Streaming a stored response (`stream=true`) is not supported by this gateway: it stores "
                              "finished responses only; retrieve it without `stream`.", "stream", "unsupported_value")
            request.respond(err.status, err.body())
            return
        if not items:
            request.respond(200, got.response)
            return
        try:
            page = list_page(list(got.input_items), request.query)
        except ApiError as e:
            request.respond(e.status, e.body())
            return
        request.respond(200, orjson.dumps(page))

    async def delete_response(self, request: HttpRequest) -> None:
        if await self._by_id(request, self.response_store.delete, "delete"):
            response_id = request.path[len("/v1/responses/"):]
            request.respond(200, orjson.dumps({"id": response_id, "object": "response.deleted", "deleted": True}))

    async def _by_id(self, request: HttpRequest, op, label: str):
        """``op(tenant, id)`` on the stored response the path names; answers the request itself when there is
        none (404), the key is refused (401) or the store is down (503), and then returns None."""
        tag_request_id(request)
        tenant = self._tenant_or_refuse(request)
        if tenant is None:
            return None
        response_id = request.path[len("/v1/responses/"):]
        try:
            got = await op(tenant, response_id)
        except StoreUnavailable:
            self.store_ops.inc(label, "error")
            err = _store_down(label)
            request.respond(err.status, err.body(), extra=err.header_lines())
            return None
        except StoredCorrupt:
            self.store_ops.inc(label, "corrupt")
            got = None
        else:
            self.store_ops.inc(label, "found" if got else "missing")
        if not got:
            err = _not_found(response_id)
            request.respond(err.status, err.body())
            return None
        return got


def _asks_stream(query: str) -> bool:
    values = parse_qs(query).get("stream")
    return bool(values) and values[-1].strip().lower() not in ("false", "0", "")


def list_page(items: list[dict[str, Any]], query: str) -> dict[str, Any]:
    """One page of a list in OpenAI's shape, as the query string (``order``, ``limit``, ``after``) asks."""
    q = {k: v[-1] for k, v in parse_qs(query).items()}
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"Invalid value for 'order': {order!r}. Supported values are: 'asc' and 'desc'.", "order")
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise bad_request(f"Invalid value for 'limit': {q.get('limit')!r}: an integer from 1 to 100.", "limit")
    seq = items if order == "asc" else items[::-1]
    if "after" in q:
        at = next((i for i, it in enumerate(seq) if it.get("id") == q["after"]), None)
        if at is None:
            raise bad_request(f"No input item with id {q['after']!r} in this response.", "after")
        seq = seq[at + 1:]
    data = seq[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(seq) > limit}
