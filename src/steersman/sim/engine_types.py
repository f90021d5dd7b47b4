"""What the engine model reports: step results, state counters, the weights state."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

__all__ = ["WeightsState", "StepResult", "EngineState"]


class WeightsState(str, Enum):
    COLD = "cold"
    LOADING = "loading"
    WARM = "warm"


@dataclass(slots=True)
class StepResult:
    """One step (read-only)."""

    start: float
    duration: float
    end: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_seqs: int
    # (req_id, output tokens so far) per request that produced a token, in running order: O(batch),
    # None when step() was called with outputs=False
    outputs: list[tuple[str, int]] | None
    finished: list[str]
    preempted: list[str]
    compute_s: float  # roofline compute side of this step
    memory_s: float  # roofline memory side of this step
    first_tokens: list[str] = field(default_factory=list)  # produced their first token in this step


@dataclass(slots=True)
class EngineState:
    """Counters and gauges (read-only)."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_usage: float  # vLLM: 1 - free / total (cached blocks with ref 0 are free)
    prefix_queries: int  # tokens looked up in the prefix cache
    prefix_hits: int  # tokens found
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    weights: WeightsState
    weights_ready_at: float | None
    busy_until: float
    num_steps: int

