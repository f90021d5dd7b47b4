"""The gateway's OpenAPI 3.1 description, served at ``GET /openapi.json``.

It documents what the gateway itself checks (types, ranges, the models it
serves, every status it answers with and the OpenAI error body), so a schema
fuzzer (Schemathesis, in tests/badinput) can hold the live gateway to it.
Engine extensions that the gateway forwards untouched (``ignore_eos``,
``guided_json``, ...) are allowed but not described: they are the engine's API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from steersman.config import DEFAULTS

__all__ = ["openapi_document"]

_ROLES = ["system", "developer", "user", "assistant", "tool", "function"]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _common(models: Sequence[str], max_tokens: int) -> dict[str, Any]:
    tokens = _nullable({"type": "integer", "minimum": 1, "maximum": max_tokens})
    return {
        "model": {"type": "string", "enum": list(models)} if models else {"type": "string", "minLength": 1},
        "stream": {"type": "boolean"},
        "stream_options": _nullable(_ref("StreamOptions")),
        "max_tokens": tokens,
        # (no maxItems: OpenAI takes 4 stop sequences, the engines behind the gateway more)
        "stop": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string", "minLength": 1}},
                           {"type": "null"}]},
        "n": {"type": "integer", "minimum": 1, "maximum": 128},
        "temperature": _nullable({"type": "number", "minimum": 0, "maximum": 2}),
        "top_p": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "seed": _nullable({"type": "integer"}),
        "user": _nullable({"type": "string"}),
        "presence_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
        "frequency_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
        "repetition_penalty": _nullable({"type": "number", "exclusiveMinimum": 0}),
        "min_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
    }


def _error_responses(*codes: int) -> dict[str, Any]:
    text = {400: "Invalid request (the field is named in `error.param`)", 401: "Missing or unknown API key",
            404: "Unknown model", 408: "The request did not arrive in time", 413: "Body over the size limit",
            415: "Body is not JSON", 429: "Rate limit or budget exceeded (Retry-After)",
            502: "The engine failed", 503: "No capacity (Retry-After)", 504: "The request's deadline passed"}
    body = {"application/json": {"schema": _ref("ErrorResponse")}}
    return {str(c): {"description": text[c], "content": body} for c in codes}


def _generation(summary: str, request: str, response: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {
            "200": {"description": "The answer, whole (JSON) or streamed (server-sent events)",
                    "content": {"application/json": {"schema": _ref(response)},
                                "text/event-stream": {"schema": _ref("StreamEvent")}}},
            **_error_responses(400, 401, 404, 408, 413, 415, 429, 502, 503, 504),
        },
    }}


def openapi_document(models: Sequence[str], max_tokens: int,
                     max_logprobs: int = DEFAULTS.gateway.max_logprobs) -> dict[str, Any]:
    """The description of a gateway serving ``models`` with ``max_tokens`` as the output bound and ``max_logprobs``
    log-probability alternatives per token at most."""
    common = _common(models, max_tokens)
    alternatives = _nullable({"type": "integer", "minimum": 0, "maximum": max_logprobs})
    message = {
        "type": "object", "required": ["role"],
        "properties": {
            "role": {"type": "string", "enum": _ROLES},
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}, {"type": "null"}]},
            "name": _nullable({"type": "string"}),
        },
    }
    chat = {"type": "object", "required": ["model", "messages"], "properties": {
        **common,
        "messages": {"type": "array", "minItems": 1, "items": _ref("ChatMessage")},
        "max_completion_tokens": common["max_tokens"],
        "response_format": _nullable({"type": "object"}),
        "logprobs": _nullable({"type": "boolean"}),
        "top_logprobs": {**alternatives, "description": "Alternatives per token; more than 0 needs `logprobs: true`."},
    }}
    prompt = {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}}]}
    completion = {"type": "object", "required": ["model", "prompt"], "properties": {
        **common, "prompt": prompt, "echo": {"type": "boolean"}, "logprobs": alternatives}}
    answer = {"type": "object", "required": ["id", "object", "created", "model", "choices"], "properties": {
        "id": {"type": "string"}, "object": {"type": "string"}, "created": {"type": "integer"},
        "model": {"type": "string"}, "choices": {"type": "array", "items": {"type": "object"}},
        "usage": _nullable({"type": "object"}),
    }}
    error = {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": _nullable({"type": "string"}), "code": _nullable({"type": "string"}),
        }}}}
    plain = {"200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}}
    by_id = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    return {
        "openapi": "3.1.0",
        "info": {"title": "steersman gateway", "version": "1", "description": "OpenAI-compatible inference gateway."},
        "paths": {
            "/v1/chat/completions": _generation("Chat completion", "ChatCompletionRequest", "Completion"),
            "/v1/completions": _generation("Text completion", "CompletionRequest", "Completion"),
            "/v1/embeddings": {"post": {
                "summary": "Embeddings of one input or a batch",
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("EmbeddingRequest")}}},
                "responses": {"200": {"description": "One vector per input", "content": {
                    "application/json": {"schema": _ref("EmbeddingList")}}},
                    **_error_responses(400, 401, 404, 408, 413, 415, 429, 502, 503, 504)}}},
            "/v1/responses": _generation("Response (OpenAI's Responses API, run as a chat completion)",
                                         "ResponsesRequest", "Response"),
            "/v1/responses/{response_id}": {
                "get": {"summary": "A stored response (stream=true: 400, only finished responses are stored)",
                        "parameters": by_id + [{"name": "stream", "in": "query", "schema": {"type": "boolean"}}],
                        "responses": {"200": {"description": "The Response object", "content": {
                            "application/json": {"schema": _ref("Response")}}}, **_error_responses(400, 401, 404, 503)}},
                "delete": {"summary": "Delete a stored response", "parameters": by_id,
                           "responses": {**plain, **_error_responses(401, 404, 503)}}},
            "/v1/responses/{response_id}/input_items": {"get": {
                "summary": "A stored response's input items (newest first unless order=asc)",
                "parameters": by_id + [
                    {"name": "order", "in": "query", "schema": {"type": "string", "enum": ["asc", "desc"]}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
                    {"name": "after", "in": "query", "schema": {"type": "string"}}],
                "responses": {**plain, **_error_responses(400, 401, 404, 503)}}},
            "/v1/models": {"get": {"summary": "Models served by the fleet",
                                   "responses": {**plain, **_error_responses(401)}}},
            "/v1/models/{model}": {"get": {
                "summary": "One model served by the fleet",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {**plain, **_error_responses(401, 404)}}},
            "/health": {"get": {"summary": "200 while a replica is healthy", "responses": {
                **plain, "503": {"description": "No healthy replica", "content": {"application/json": {"schema": {"type": "object"}}}}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": plain}},
        },
        "components": {"schemas": {
            "ChatCompletionRequest": chat, "CompletionRequest": completion, "ChatMessage": message,
            "StreamOptions": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
            "Completion": answer, "ErrorResponse": error, **_responses_schemas(common),
            **_embedding_schemas(common),
            # one server-sent event: a JSON chunk, a JSON error (a stream that failed), or [DONE]
            "StreamEvent": {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}},
        }},
    }


def _responses_schemas(common: dict[str, Any]) -> dict[str, Any]:
    """The Responses API's request and Response object, as far as the gateway checks and answers them."""
    text = {"type": "object", "required": ["type", "text"], "properties": {
        "type": {"type": "string", "enum": ["input_text", "output_text"]}, "text": {"type": "string"}}}
    content = {"anyOf": [{"type": "string"}, {"type": "array", "items": text}]}
    item = {"anyOf": [
        {"type": "object", "required": ["role", "content"], "properties": {
            "type": {"type": "string", "enum": ["message"]},
            "role": {"type": "string", "enum": ["user", "assistant", "system", "developer"]}, "content": content}},
        {"type": "object", "required": ["type", "call_id", "name", "arguments"], "properties": {
            "type": {"type": "string", "enum": ["function_call"]}, "call_id": {"type": "string"},
            "name": {"type": "string"}, "arguments": {"type": "string"}}},
        {"type": "object", "required": ["type", "call_id", "output"], "properties": {
            "type": {"type": "string", "enum": ["function_call_output"]}, "call_id": {"type": "string"},
            "output": content}},
    ]}
    tool = {"type": "object", "required": ["type", "name"], "properties": {
        "type": {"type": "string", "enum": ["function"]}, "name": {"type": "string", "minLength": 1},
        "description": _nullable({"type": "string"}), "parameters": _nullable({"type": "object"})}}
    request = {"type": "object", "required": ["model", "input"], "properties": {
        "model": common["model"], "stream": common["stream"], "temperature": common["temperature"],
        "top_p": common["top_p"], "user": common["user"], "max_output_tokens": common["max_tokens"],
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": item}]},
        "instructions": _nullable({"type": "string"}),
        "previous_response_id": {**_nullable({"type": "string"}), "description": "A stored response of the same tenant."},
        "store": {"type": "boolean"},
        "metadata": _nullable({"type": "object", "maxProperties": 16, "additionalProperties": {"type": "string"}}),
        "tools": {"type": "array", "items": tool},
        "tool_choice": {"anyOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {
            "type": "object", "required": ["type", "name"], "properties": {
                "type": {"type": "string", "enum": ["function"]}, "name": {"type": "string"}}}]},
        "text": {"type": "object", "properties": {"format": {"type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]}}}}},
        "truncation": {"type": "string", "enum": ["auto", "disabled"]},
    }}
    response = {"type": "object", "required": ["id", "object", "created_at", "status", "model", "output"],
                "properties": {"id": {"type": "string"}, "object": {"type": "string", "enum": ["response"]},
                               "created_at": {"type": "integer"},
                               "status": {"type": "string", "enum": ["completed", "incomplete", "failed"]},
                               "model": {"type": "string"}, "output": {"type": "array", "items": {"type": "object"}},
                               "usage": _nullable({"type": "object"})}}
    return {"ResponsesRequest": request, "Response": response}


def _embedding_schemas(common: dict[str, Any]) -> dict[str, Any]:
    text = {"type": "string", "minLength": 1}
    ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
    request = {"type": "object", "required": ["model", "input"], "properties": {
        "model": common["model"], "user": common["user"],
        "input": {"anyOf": [text, {"type": "array", "minItems": 1, "maxItems": 2048, "items": text}, ids,
                            {"type": "array", "minItems": 1, "maxItems": 2048, "items": ids}]},
        "encoding_format": {"type": "string", "enum": ["float", "base64"]},
        "dimensions": _nullable({"type": "integer", "minimum": 1}),
    }}
    vector = {"anyOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]}
    answer = {"type": "object", "required": ["object", "data", "model"], "properties": {
        "object": {"type": "string", "enum": ["list"]}, "model": {"type": "string"},
        "data": {"type": "array", "items": {"type": "object", "required": ["object", "index", "embedding"],
                                            "properties": {"object": {"type": "string"}, "index": {"type": "integer"},
                                                           "embedding": vector}}},
        "usage": _nullable({"type": "object"})}}
    return {"EmbeddingRequest": request, "EmbeddingList": answer}
