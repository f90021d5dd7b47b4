"""Structured output in engine-sim, as vLLM's guided decoding gives it.

A request that constrains its output gets an output that satisfies the constraint instead of pseudo-text:

* a JSON schema -- ``response_format: {"type": "json_schema", "json_schema": {"schema": S}}`` (OpenAI),
  ``guided_json`` / ``structured_outputs: {"json": S}`` (vLLM), ``json_schema`` (llama.cpp) -- a JSON document
  valid against it;
* ``response_format: {"type": "json_object"}`` -- a JSON object;
* ``guided_choice`` / ``structured_outputs: {"choice": [...]}`` -- one of the strings;
* ``guided_regex`` / ``structured_outputs: {"regex": R}`` -- a string R matches whole
  (:mod:`steersman.enginesim.regexgen`); an invalid pattern, or one it cannot draw a match for, is a 400 naming
  the field (vLLM refuses an invalid one too).

Like the pseudo-text it is a function of the context (and the sample's ``variant``), made of short pieces, one
per token, so the engine model paces it and ``max_tokens`` cuts it (``finish_reason: "length"``, an unfinished
document, as vLLM's).  A grammar (``guided_grammar``, ``structured_outputs: {"grammar": G}``, llama.cpp's
``grammar``) is not generated from: a 400 naming the field says so (text that ignores it would look like an answer).

The schema subset covers what structured-output clients send: ``type`` (one or a list), ``properties`` /
``required``, ``items`` / ``minItems`` / ``maxItems``, ``enum``, ``const``, ``anyOf`` / ``oneOf`` / ``allOf``
(the first branch), local ``$ref`` (``#/$defs/...``, ``#/definitions/...``), ``minimum`` / ``maximum``,
``minLength`` / ``maxLength``.  Keywords outside it are ignored, so a schema relying on them (``pattern``,
``format``) may not be met.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

import orjson

from steersman.api.errors import bad_request
from steersman.enginesim.regexgen import regex_sample
from steersman.enginesim.textgen import _WORDS, Generation, context_hash

__all__ = ["constraint", "structured"]

_MAX_DEPTH = 6  # below it: only required properties, no optional array items (a recursive schema ends)
_PIECE = re.compile(r'[{}\[\],:]|"|\s+|[^{}\[\],:"\s]{1,6}')


def constraint(req: Any) -> tuple[str, Any] | None:
    """``("json", schema)`` (``None`` schema: any JSON object), ``("choice", strings)`` or ``("regex", (pattern, a
    match))`` the request asks its output to satisfy, or ``None``; a 400 for a pattern it cannot match."""
    so = getattr(req, "structured_outputs", None)
    grammars = (("guided_grammar", getattr(req, "guided_grammar", None)), ("grammar", getattr(req, "grammar", None)),
                ("structured_outputs", so.get("grammar") if isinstance(so, dict) else None))
    for field, grammar in grammars:
        if isinstance(grammar, str) and grammar:
            raise bad_request(f"`{field}`: engine-sim does not generate from grammars (JSON schemas, choices and "
                              "regular expressions it does).", field, "unsupported_value")
    if isinstance(so, dict) and isinstance(so.get("regex"), str):
        return _regex(so["regex"], "structured_outputs")
    if isinstance(getattr(req, "guided_regex", None), str):
        return _regex(req.guided_regex, "guided_regex")
    if isinstance(so, dict):
        if isinstance(so.get("json"), (dict, str)):
            return "json", _schema(so["json"])
        if isinstance(so.get("choice"), list) and so["choice"]:
            return "choice", [str(c) for c in so["choice"]]
        if so.get("json_object"):
            return "json", None
    if isinstance(getattr(req, "guided_json", None), (dict, str)):
        return "json", _schema(req.guided_json)
    if isinstance(getattr(req, "guided_choice", None), list) and req.guided_choice:
        return "choice", [str(c) for c in req.guided_choice]
    if isinstance(getattr(req, "json_schema", None), dict):  # llama.cpp
        return "json", req.json_schema
    rf = getattr(req, "response_format", None)
    if isinstance(rf, dict):
        if rf.get("type") == "json_schema":
            js = rf.get("json_schema")
            return "json", (js.get("schema") if isinstance(js, dict) and isinstance(js.get("schema"), dict) else None)
        if rf.get("type") == "json_object":
            return "json", None
    return None


def _regex(pattern: str, field: str) -> tuple[str, tuple[str, str]]:
    try:
        first = regex_sample(pattern, random.Random(0))
    except (re.error, OverflowError) as e:
        raise bad_request(f"`{field}` is not a valid regular expression: {e}.", field) from None
    if first is None:
        raise bad_request(f"`{field}`: engine-sim cannot generate a match for this pattern (lookarounds or "
                          "boundaries its draws break).", field, "unsupported_value")
    return "regex", (pattern, first)


def _schema(s: dict | str) -> dict | None:
    if isinstance(s, dict):
        return s
    try:
        doc = orjson.loads(s)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def structured(context: str | Sequence[int], kind: str, spec: Any, max_tokens: int, variant: int = 0) -> Generation:
    """The output satisfying ``(kind, spec)`` (see :func:`constraint`), cut to ``max_tokens`` pieces."""
    rng = random.Random(context_hash(context) * 1_000_003 + variant)
    if kind == "choice":
        text = spec[rng.randrange(len(spec))]
    elif kind == "regex":
        text = regex_sample(spec[0], rng) or spec[1]
    else:
        value = _value(spec if isinstance(spec, dict) else {"type": "object"}, spec if isinstance(spec, dict) else {},
                       rng, 0)
        if spec is None and not value:
            value = {"answer": _words(rng, 2, 6)}
        text = orjson.dumps(value).decode()
    pieces = _PIECE.findall(text) or [text]
    if len(pieces) > max_tokens:
        pieces = pieces[:max_tokens]
        return Generation(pieces, "length", "".join(pieces))
    return Generation(pieces, "stop", text)


def _num(v: Any) -> int | float | None:
    """A schema's numeric keyword, None when absent (or not a number: a boolean is none)."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def _resolve(schema: dict, root: dict) -> dict:
    for _ in range(16):  # a chain of references, bounded
        ref = schema.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return {}
        schema = node
    return schema


def _value(schema: Any, root: dict, rng: random.Random, depth: int) -> Any:
    if not isinstance(schema, dict):
        return None  # `true` / `false` schemas and junk: null
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[rng.randrange(len(enum))]
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            return _value(branches[0], root, rng, depth)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = set(schema.get("required") or ())
        out = {}
        for name, sub in props.items():
            if name in required or (depth < _MAX_DEPTH and rng.random() < 0.5):
                out[name] = _value(sub, root, rng, depth + 1)
        return out
    if kind == "array":
        lo = schema.get("minItems", 0)
        lo = lo if isinstance(lo, int) and lo >= 0 else 0
        hi = schema.get("maxItems", lo + 3)
        hi = hi if isinstance(hi, int) and hi >= lo else lo + 3
        n = lo if depth >= _MAX_DEPTH else rng.randint(max(lo, min(1, hi)), min(hi, lo + 3))
        return [_value(schema.get("items", {}), root, rng, depth + 1) for _ in range(n)]
    if kind in ("integer", "number"):
        # an exclusive bound is an inclusive one a step inside (1 for an integer, the output's 0.001 for a number)
        step = 1 if kind == "integer" else 0.001
        lo, hi = _num(schema.get("minimum")), _num(schema.get("maximum"))
        xlo, xhi = _num(schema.get("exclusiveMinimum")), _num(schema.get("exclusiveMaximum"))
        if xlo is not None:
            lo = xlo + step if lo is None else max(lo, xlo + step)
        if xhi is not None:
            hi = xhi - step if hi is None else min(hi, xhi - step)
        if lo is None:
            lo = 0 if hi is None or hi >= 0 else hi - 100  # only a maximum: a range below it
        hi = hi if hi is not None and hi >= lo else lo + 100
        if kind == "integer":
            ilo, ihi = int(-(-lo // 1)), int(hi // 1)
            return rng.randint(ilo, ihi) if ihi >= ilo else ilo
        return min(max(round(rng.uniform(lo, hi), 3), lo), hi)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    text = _words(rng, 1, 4)
    lo, hi = schema.get("minLength", 0), schema.get("maxLength")
    if isinstance(lo, int) and len(text) < lo:
        text = (text + " " + _words(rng, lo, lo))[:lo] if lo else text
    if isinstance(hi, int) and hi >= 0:
        text = text[:hi]
    return text
