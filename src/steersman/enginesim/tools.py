"""Tool calls in engine-sim, shaped as vLLM's (OpenAI's) so an agent loop can run against the simulated fleet.

Which requests call a tool (chat requests with ``tools``; with ``n`` > 1 each choice calls one of its own):

* ``tool_choice: "none"``: never (text);
* a named function (``{"type": "function", "function": {"name": N}}``): that one, ``finish_reason: "stop"``
  (OpenAI's answer to a named choice);
* ``"required"``: a tool always; ``"auto"`` (the default when tools are given): a tool when the last message is
  the user's, text once a tool's result came back -- an agent's usual trajectory (ask, call, read the result,
  answer), which ends; both ``finish_reason: "tool_calls"``.

The function is picked from the context's hash among those offered; its ``arguments`` are a JSON document valid
against its ``parameters`` schema (:mod:`steersman.enginesim.structured`), streamed piece by piece as vLLM's
``delta.tool_calls[0].function.arguments``; ``max_tokens`` cuts them (``finish_reason: "length"``).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from steersman.api.tools import chosen_tool
from steersman.enginesim.structured import structured
from steersman.enginesim.textgen import Generation, context_hash

__all__ = ["ToolCall", "plan_tool_call"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    call_id: str
    name: str


def plan_tool_call(req: Any, context: str | Sequence[int], max_tokens: int,
                   variant: int = 0) -> tuple[ToolCall, Generation] | None:
    """The tool call a chat request gets (its id and function, and the arguments as a generation), or None;
    ``variant``: the request's sample (``n`` > 1: each choice calls a tool of its own)."""
    tools = getattr(req, "tools", None)
    if not tools:
        return None
    fns, choice = chosen_tool(tools, getattr(req, "tool_choice", None))
    reason = "tool_calls"
    if isinstance(choice, dict):
        chosen, reason = choice, "stop"
    elif choice == "required" or (choice == "auto" and req.messages and req.messages[-1].role == "user"):
        chosen = fns[(context_hash(context) + variant) % len(fns)]
    else:
        return None
    params = chosen.get("parameters") if isinstance(chosen.get("parameters"), dict) else {"type": "object"}
    gen = structured(context, "json", params, max_tokens, variant)
    if gen.finish_reason == "stop":
        gen = Generation(gen.pieces, reason, gen.text)
    return ToolCall(f"chatcmpl-tool-{secrets.token_hex(16)}", chosen["name"]), gen
