"""The pre-lazy engine oracle: requests (verbatim from commit 924c35a; see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from steersman.text.tokenizer import ROOT_HASH



WAITING = "waiting"  # queued, new or preempted (then num_preemptions > 0)
RUNNING = "running"
FINISHED = "finished"
ABORTED = "aborted"


@dataclass(slots=True, eq=False)
class LegacyRequest:
    """One generation request.

    The caller decides the output length up front (``max_output`` includes the
    EOS / stop token): the request finishes when it has produced that many tokens.
    ``block_hashes`` are the chained hashes of the prompt's full blocks
    (:func:`steersman.text.tokenizer.block_hashes` with the engine's block size);
    fewer (or none) just means less can be cached.

    Optional output-block caching (vLLM v1 caches full blocks of generated tokens
    too): give ``output_token_ids(n)`` returning the first ``n`` output token ids,
    and ``prompt_tail``, the prompt tokens after its last full block (the block that
    straddles prompt and output needs them).  Without it, only prompt blocks are
    cached.

    Fields after ``prompt_tail`` are maintained by the engine; read them, don't set them.
    """

    req_id: str
    prompt_len: int
    max_output: int
    block_hashes: Sequence[int] = ()
    priority: int = 0
    arrival: float = 0.0
    output_token_ids: Callable[[int], Sequence[int]] | None = field(default=None, repr=False)
    prompt_tail: Sequence[int] = field(default=(), repr=False)

    status: str = field(default=WAITING, init=False)
    num_computed: int = field(default=0, init=False)  # tokens whose KV is computed (or hit)
    num_output: int = field(default=0, init=False)  # tokens produced so far
    num_cached_tokens: int = field(default=-1, init=False)  # prefix hit at first scheduling (-1: not yet)
    num_preemptions: int = field(default=0, init=False)
    first_scheduled_at: float | None = field(default=None, init=False)
    first_token_at: float | None = field(default=None, init=False)
    finished_at: float | None = field(default=None, init=False)
    # KV blocks held, in order: the block's hash if it is in the prefix cache, else None.
    blocks: list[int | None] = field(default_factory=list, init=False, repr=False)
    num_hashed: int = field(default=0, init=False, repr=False)  # leading blocks already offered to the cache
    out_hashes: list[int] = field(default_factory=list, init=False, repr=False)  # hashes of full output blocks
    seq: int = field(default=0, init=False, repr=False)  # arrival order in this engine

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens (what a recompute after preemption must prefill)."""
        return self.prompt_len + self.num_output

    @property
    def done(self) -> bool:
        return self.status == FINISHED or self.status == ABORTED

    def block_hash(self, i: int, block_size: int) -> int | None:
        """Chained hash of full block ``i`` of the sequence, or None if it cannot be known."""
        ph = self.block_hashes
        if i < len(ph):
            return ph[i]
        fn = self.output_token_ids
        if fn is None or len(ph) != self.prompt_len // block_size:
            return None
        oh = self.out_hashes
        j = i - len(ph)
        while len(oh) <= j:
            start = (len(ph) + len(oh)) * block_size
            end = start + block_size
            p = self.prompt_len
            parent = oh[-1] if oh else (ph[-1] if ph else ROOT_HASH)
            toks: list[int] = []
            if start < p:
                base = p - len(self.prompt_tail)
                toks.extend(self.prompt_tail[start - base :])
            toks.extend(fn(end - p)[max(0, start - p) : end - p])
            oh.append(hash((parent, *toks)))
        return oh[j]


_NEVER = 1 << 62  # num_hashed sentinel: no further block of this request can be hashed


class _Run:
    """``n`` consecutive free uncached blocks in the free queue."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n
