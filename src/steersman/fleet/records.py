"""What the fleet records per replica and per routed request: :class:`Replica` (one engine endpoint) and
:class:`Ticket` (what one routed request added to its replica's accounting).  Kept apart from
:mod:`steersman.fleet.state`, which re-exports them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from steersman.engines.base import EngineAdapter, ReplicaAddress

__all__ = ["Replica", "Ticket", "attention_pairs"]


def attention_pairs(prompt_tokens: int, uncached: int) -> float:
    """The (query, key) token pairs the prefill of the last ``uncached`` of ``prompt_tokens`` computes:
    each token attends to every one before it, so (L^2 - h^2) / 2 with ``h`` the cached prefix (exact in a
    float64 for any prompt under 10^8 tokens, so adding and removing it leaves no residue)."""
    h = prompt_tokens - uncached
    return (prompt_tokens * prompt_tokens - h * h) / 2.0


@dataclass(slots=True)
class Replica:
    index: int
    name: str
    url: str
    engine: str
    gpu: str | None
    models: tuple[str, ...]
    pool: str
    price_per_hour: float
    tp: int
    adapter: EngineAdapter
    priority_scheduling: bool = False  # the engine takes a per-request ``priority`` (vLLM --scheduling-policy priority)
    handoff_s_per_token: float = 0.0  # a prefill replica of a disaggregated fleet (the twin): see ReplicaSpec
    kv_unified: bool | None = None  # llama.cpp: its slots share one KV pool (see ReplicaAddress.kv_unified)
    loras: tuple[str, ...] = ()  # of ``models``, the LoRA adapters (their KV apart: see EndpointConfig.lora_modules)
    #: the model profile its latency is predicted with, where ``models`` name it otherwise (a served model name);
    #: None: ``models[0]``
    model_profile: str | None = None
    address: ReplicaAddress = field(init=False)

    def __post_init__(self) -> None:
        self.address = ReplicaAddress(self.name, self.url, self.kv_unified)


@dataclass(slots=True)
class Ticket:
    """What one routed request added to a replica's accounting (removed again at the end)."""

    replica: int
    uncached: int  # prompt tokens predicted to need prefill
    blocks: int  # KV blocks the request holds (prompt + expected output)
    started: float
    cost_mark: float = 0.0  # the replica's cost integral at its start (Fleet._accrue): its cost is the rise since
    predicted_ttft: float | None = None  # what the scheduler expected, to learn the per-replica correction
    predicted_tpot: float | None = None
    first_at: float | None = None
    verdict: bool | None = None  # the attempt's verdict on the replica: served (True) / server-side failure (False)
    on_first: Any = None  # called once at the first token (the runner releases a retry-budget token)
    key: int = 0  # the fleet's sequence number of this ticket: its identity for the reliability guard
    streamed: bool = True  # False: the engine answers all at once, so its "first token" is the whole response
    tpot_target: float = 0.0  # the TPOT it must keep (x its margin): later requests must not slow it past that
    pairs: float = 0.0  # the attention work of its uncached prefill (snapshot.PENDING_PAIRS: (L^2 - h^2) / 2)
    cache_at_end: Sequence[int] | None = None  # prompt blocks the prefix index credits the replica with when the
    # request ends, if it ran (an engine whose slot frees its prompt only then: see EngineAdapter.shares_prefill_in_flight)
