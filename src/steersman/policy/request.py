"""What the scheduler knows about a request: a typed, frozen context filled by the gateway.

The same objects are built by the live gateway and by the digital twin, so every
policy sees requests the same way in both.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["PriorityClass", "LatencyBudget", "WorkflowView", "SchedRequest", "PROMPT_FIELD"]

#: the request field holding the prompt, by kind: what a refusal of the prompt (too long, unsupported) names
PROMPT_FIELD = MappingProxyType({"chat": "messages", "completion": "prompt", "embedding": "input"})


class PriorityClass(enum.IntEnum):
    """Tenant priority bands; a lower value is more important.  Shedding goes from BATCH up."""

    CRITICAL = 0
    STANDARD = 1
    SHEDDABLE = 2
    BATCH = 3

    @classmethod
    def parse(cls, name: str) -> PriorityClass:
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown priority class {name!r}; known: {', '.join(c.name.lower() for c in cls)}") from None


@dataclass(frozen=True, slots=True)
class LatencyBudget:
    """Targets for one request; ``None`` means no target on that axis."""

    ttft_s: float | None = None  # time to first token
    tpot_s: float | None = None  # time per output token
    deadline: float | None = None  # absolute clock time by which the response must be complete
    slo_class: str | None = None


@dataclass(frozen=True, slots=True)
class WorkflowView:
    """An agent's task this request belongs to: step ``step`` of about ``steps``."""

    workflow_id: str
    step: int  # k, 1-based
    steps: int | None  # expected n (None: unknown)
    calls: int  # calls completed before this one
    tokens: int  # tokens used so far
    spent_usd: float  # sunk cost so far
    started: float  # clock time of the first call
    value: float  # protection value (see steersman.control.workflow), >= 0
    missed: bool = False  # a call of it has missed its SLO: the task has failed


@dataclass(frozen=True, slots=True)
class SchedRequest:
    seq: int  # gateway request counter: deterministic tie-breaker and seed
    model: str
    kind: str  # "chat" | "completion" | "embedding"
    stream: bool
    tenant: str
    priority: PriorityClass
    arrival: float  # clock time the gateway received it
    prompt_tokens: int
    block_hashes: tuple[int, ...]  # chained hashes of full prompt blocks (steersman.text.block_hashes)
    max_tokens: int | None
    expected_output: int  # max_tokens, or the fleet's running estimate when absent
    budget: LatencyBudget = LatencyBudget()
    workflow: WorkflowView | None = None
    excluded: frozenset[int] = frozenset()  # replicas not to pick (a retry avoids the ones that failed it)
    #: a stream under way moving to another replica (its replica failed mid-stream): its load was admitted and
    #: running already, so the gates on *new* work (adaptive concurrency limit, saturation queue) do not hold
    #: it back; ejection, breakers and exclusions still apply
    resumed: bool = False
    #: requests ahead of it in the gateway queue that wait for a llama.cpp slot holding the same prompt (each
    #: running copy serves one of them: steersman.policy.slot_wait); the control plane sets it when it asks
    slot_waiters_ahead: int = 0
    #: ``n``: the samples it runs as (the engine decodes each as a sequence of its own, side by side): its output
    #: tokens are counted over all of them; the per-token timing and output length learnt from it are one sample's
    samples: int = 1
    #: a batch of prompts (a completion's or an embedding's inputs, each its own sequence in the engine): the
    #: longest one's tokens (None: one prompt, ``prompt_tokens``).  Whether a replica's whole KV cache can ever
    #: hold the request is a question about one sequence; the load and the KV pressure count them all
    longest_prompt_tokens: int | None = None

    @property
    def longest_prompt(self) -> int:
        """The tokens of its longest prompt: one sequence's, what a replica's whole KV cache must hold."""
        n = self.longest_prompt_tokens
        return self.prompt_tokens if n is None else n

    @property
    def kv_tokens(self) -> int:
        """The KV cache it is expected to hold at its end: the prompt (its blocks shared by the samples) and each
        sample's expected output."""
        return self.prompt_tokens + self.samples * self.expected_output

    @property
    def limit_tokens(self) -> int:
        """What a tenant's tokens-per-minute bucket reserves for it on arrival: the prompt and each sample's
        ``max_tokens`` (OpenAI counts ``max_tokens`` against a TPM limit when the request arrives), so a burst of
        requests cannot take more than the bucket holds whatever they end up generating; without ``max_tokens``,
        each sample's expected output (:attr:`kv_tokens`).  Settled with what it used."""
        per_sample = self.expected_output if self.max_tokens is None else max(self.max_tokens, self.expected_output)
        return self.prompt_tokens + self.samples * per_sample

    @property
    def protection(self) -> float:
        return self.workflow.value if self.workflow is not None else 0.0
