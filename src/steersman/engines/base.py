"""The engine adapter extension point: how the gateway talks to one kind of engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from steersman.http.client import Endpoint, Exchange, UpstreamError

__all__ = ["EngineMetrics", "UpstreamError", "EngineAdapter", "ReplicaAddress", "Exchange", "ModelList", "model_list"]


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """What the fleet learns from one scrape of an engine's ``/metrics``."""

    num_running: float = 0.0
    num_waiting: float = 0.0
    kv_usage: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    weights: str | None = None  # "cold" | "loading" | "warm" when the engine says
    kv_blocks_total: float | None = None  # KV capacity in blocks when the engine says (vLLM cache_config_info)
    #: the engine's own cumulative timing of its work, when it reports it (llama.cpp): seconds spent on
    #: prompt processing and the prompt tokens computed in them; seconds generating and the tokens generated
    prefill_seconds: float | None = None
    prefill_tokens: float | None = None
    decode_seconds: float | None = None
    decode_tokens: float | None = None
    slots: int | None = None  # parallel slots, when the engine says (llama.cpp /slots)
    #: a cumulative count of the engine's work that advances while it computes anything (tokens, or llama.cpp's
    #: decode calls), when its page has one: live progress for the stall rule, also of requests that stream
    #: nothing to the gateway (see steersman.engines.metric_names)
    progress: float | None = None


@dataclass(frozen=True, slots=True)
class ReplicaAddress:
    name: str
    url: str
    #: llama.cpp: its slots share one KV pool (llama-server --kv-unified), which its pages cannot tell from one pool
    #: per slot; None: not known (the adapter infers it, see steersman.engines.llamacpp)
    kv_unified: bool | None = None
    endpoint: Endpoint = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoint", Endpoint.parse(self.url))


@runtime_checkable
class EngineAdapter(Protocol):
    """One per engine kind (``vllm``, ``engine-sim``, ``openai``, ...), registered by name."""

    kind: str
    #: Can a request reuse prompt blocks that another request on the same replica is still prefilling?
    #: vLLM v1 and SGLang register a prompt's blocks as they are scheduled, so a follower shares them;
    #: llama.cpp caches a prompt in the slot that ran it, and a slot's prompt is reused only once the slot
    #: is free: a follower sent at the holder's first token prefilled the whole prompt again (cache_n 0 of
    #: 311 tokens, llama-server of llama-cpp-python 0.3.36), one sent after the holder ended reused 298.
    #: When False the gateway credits the replica with a prompt's blocks when its request ends (if it ran)
    #: instead of at dispatch; ``tests/real/test_llamacpp_slot_reuse.py`` pins the engine's behaviour.
    shares_prefill_in_flight: bool
    #: Does an idle replica need a canary request to show that its engine hangs
    #: (:mod:`steersman.reliability.idle_probe`)?  vLLM and SGLang serve ``/metrics`` from their API server,
    #: which answers while the engine core hangs; llama-server answers ``/metrics`` from a task on its
    #: inference loop's queue (``SERVER_TASK_TYPE_METRICS``, tools/server/server-context.cpp), so a hung loop
    #: already fails the scrape, and a canary would take a free slot and evict the prompt cached there.
    idle_probe: bool

    async def send(self, replica: ReplicaAddress, path: str, body: bytes,
                   sent: Callable[[], None] | None = None, headers: bytes = b"") -> Exchange:
        """POST a JSON ``body`` to ``replica``'s ``path``; returns once response headers arrived.

        ``sent``: called once, as soon as the request's bytes are written to the connection (or before
        waiting for a new connection to open): work the caller wants done off the engine's time to first
        token.  ``headers``: more request header lines, each ending in CRLF (request id, trace context).
        Raises :class:`UpstreamError`.
        """
        ...

    async def scrape(self, replica: ReplicaAddress) -> EngineMetrics:
        """Read the engine's load metrics; raises :class:`UpstreamError`."""
        ...

    async def list_models(self, replica: ReplicaAddress) -> list[str]:
        """The models the engine serves (``/v1/models``); a :class:`ModelList` also says which are LoRA adapters."""
        ...

    async def health(self, replica: ReplicaAddress) -> bool: ...

    async def close(self) -> None: ...


class ModelList(list):
    """Model names from an engine's ``/v1/models``; ``loras``: those that are LoRA adapters of a base model listed
    there (vLLM lists each ``--lora-modules`` adapter with its base model as ``parent``)."""

    loras: tuple[str, ...] = ()


def model_list(page: Any) -> ModelList:
    """The names of an OpenAI model list (a decoded ``/v1/models`` body); an entry whose ``parent`` names another
    model is a LoRA adapter (vLLM's ``ModelCard.parent``; a base model's is null).  Raises KeyError / TypeError /
    AttributeError for a page that is no model list."""
    out = ModelList()
    loras = []
    for m in page.get("data", []):
        name = str(m["id"])
        out.append(name)
        parent = m.get("parent")
        if isinstance(parent, str) and parent and parent != name:
            loras.append(name)
    out.loras = tuple(loras)
    return out
