"""Agent application shapes: :class:`AgentApp` (token and call distributions) and the talk's :data:`PRESETS`.

The generator that turns an application into tasks and calls is :mod:`.agents`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from steersman.twin.workload.dists import Dist, LogNormal, LogUniform, Uniform, parse_dist

__all__ = ["AgentApp", "PRESETS", "preset"]


@dataclass(frozen=True)
class AgentApp:
    """The shape of one application (token and call distributions); see the module docstring."""

    kind: str
    system_prompt_tokens: int
    task_tokens: Dist
    calls: Dist
    output_tokens: Dist
    tool_tokens: Dist
    gap_s: Dist
    max_tokens: int | None = None
    max_context_tokens: int | None = None
    compact_to_tokens: int = 4000
    retries: int = 2
    retry_backoff_s: float = 1.0
    announce_steps: bool = True
    system_prompt_id: str | None = None  # sources naming the same id share the system prompt's blocks

    def __post_init__(self) -> None:
        for f in ("task_tokens", "calls", "output_tokens", "tool_tokens", "gap_s"):
            object.__setattr__(self, f, parse_dist(getattr(self, f)))
        S = self.system_prompt_tokens
        if not isinstance(S, int) or S < 0:
            raise ValueError(f"system_prompt_tokens must be an integer >= 0, got {S!r}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1 or None, got {self.max_tokens!r}")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be an integer >= 0, got {self.retries!r}")
        if not (self.retry_backoff_s >= 0 and math.isfinite(self.retry_backoff_s)):
            raise ValueError(f"retry_backoff_s must be >= 0, got {self.retry_backoff_s!r}")
        if not isinstance(self.compact_to_tokens, int) or self.compact_to_tokens < 1:
            raise ValueError(f"compact_to_tokens must be an integer >= 1, got {self.compact_to_tokens!r}")
        cap = self.max_context_tokens
        if cap is not None:
            if not isinstance(cap, int) or cap < 1:
                raise ValueError(f"max_context_tokens must be an integer >= 1 or None, got {cap!r}")
            if S + self.compact_to_tokens >= cap:
                raise ValueError(
                    f"max_context_tokens ({cap}) must exceed system_prompt_tokens + compact_to_tokens "
                    f"({S} + {self.compact_to_tokens})"
                )

    def replace(self, **changes) -> AgentApp:
        return dataclasses.replace(self, **changes)


#: The talk's application shapes.  Token sizes: chat calibrated on the Azure LLM 2023
#: conversation trace (mean output 211 tokens); agents on typical tool-using loops.
PRESETS: Mapping[str, AgentApp] = {
    "chatbot": AgentApp(
        kind="chatbot", system_prompt_tokens=400,
        task_tokens=LogNormal.from_mean_cv(200, 1.5), calls=Uniform(1, 6, integer=True),  # a few turns per session
        output_tokens=LogNormal.from_mean_cv(220, 1.0), tool_tokens=LogNormal.from_mean_cv(80, 1.0),  # next user message
        gap_s=LogNormal.from_mean_cv(20.0, 1.0),  # the user reads and types
        max_tokens=1024, max_context_tokens=16384, compact_to_tokens=2000, retries=1,
    ),
    "copilot": AgentApp(
        kind="copilot", system_prompt_tokens=2000,
        task_tokens=LogNormal.from_mean_cv(1500, 0.8), calls=Uniform(10, 20, integer=True),
        output_tokens=LogNormal.from_mean_cv(200, 1.0), tool_tokens=LogNormal.from_mean_cv(400, 1.0),
        gap_s=LogNormal.from_mean_cv(1.5, 1.0),  # tool runs, edits
        max_tokens=2048, max_context_tokens=32768, compact_to_tokens=8000, retries=2,
    ),
    "research": AgentApp(
        kind="research", system_prompt_tokens=3000,
        task_tokens=LogNormal.from_mean_cv(300, 1.0), calls=Uniform(40, 60, integer=True),  # ~50 calls
        output_tokens=LogNormal.from_mean_cv(400, 1.0), tool_tokens=LogNormal.from_mean_cv(2000, 1.0),  # fetched pages
        gap_s=LogNormal.from_mean_cv(3.0, 1.0),  # search and fetch
        max_tokens=4096, max_context_tokens=65536, compact_to_tokens=8000, retries=2,
    ),
    "autonomous": AgentApp(
        kind="autonomous", system_prompt_tokens=5000,
        task_tokens=LogNormal.from_mean_cv(800, 1.0), calls=LogUniform(200, 3000),  # hundreds to thousands
        output_tokens=LogNormal.from_mean_cv(350, 1.0), tool_tokens=LogNormal.from_mean_cv(800, 1.5),
        gap_s=LogNormal.from_mean_cv(2.0, 1.0),
        max_tokens=4096, max_context_tokens=65536, compact_to_tokens=12000, retries=3,
    ),
}


def preset(kind: str, **overrides) -> AgentApp:
    """A preset application with some fields changed (distribution fields take spec values too)."""
    if kind not in PRESETS:
        raise ValueError(f"unknown application kind {kind!r}; known: {sorted(PRESETS)}")
    return PRESETS[kind].replace(**overrides)
