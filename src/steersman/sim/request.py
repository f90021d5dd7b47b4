"""A request as the engine model sees it: token counts, prefix hashes and progress."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from steersman.text.tokenizer import ROOT_HASH

__all__ = ["SimRequest", "WAITING", "RUNNING", "FINISHED", "ABORTED"]

WAITING = "waiting"  # queued, new or preempted (then num_preemptions > 0)
RUNNING = "running"
FINISHED = "finished"
ABORTED = "aborted"

_NEVER = 1 << 62  # num_hashed sentinel: no further block of this request can be hashed


class DecodeClock:
    """The engine-wide decode-step counter that lazily decoding requests read.

    While a request decodes in the engine's lazy decode set, its stored progress
    (``_computed``, ``_output``) is the value at counter ``_base``; every decode step
    of the set advances the counter by one, so the live value is
    stored + (``d`` - ``_base``), computed on read.
    """

    __slots__ = ("d", "bs")

    def __init__(self, block_size: int) -> None:
        self.d = 0
        self.bs = block_size


@dataclass(slots=True, eq=False)
class SimRequest:
    """One generation request.

    The caller decides the output length up front (``max_output`` includes the
    EOS / stop token): the request finishes when it has produced that many tokens.
    ``block_hashes`` are the chained hashes of the prompt's full blocks
    (:func:`steersman.text.tokenizer.block_hashes` with the engine's block size);
    fewer (or none) just means less can be cached.  Equal hashes must mean equal
    prefixes (chained), as the engine identifies a prefix by one block's hash.  A
    list is used as is (an array or tuple is converted once).

    Optional output-block caching (vLLM v1 caches full blocks of generated tokens
    too): give ``output_token_ids(n)`` returning the first ``n`` output token ids,
    and ``prompt_tail``, the prompt tokens after its last full block (the block that
    straddles prompt and output needs them).  Without it, only prompt blocks are
    cached.

    ``kv_ready``: the decode side of a disaggregated request.  Its prompt's KV and its
    first token come from a prefill replica: it starts with one output token,
    admission allocates the blocks of prompt + that token without computing any
    (the KV is written by the transfer), and it decodes from its second token on
    (``max_output`` counts the first; it must be >= 2).  If it is preempted, it
    recomputes locally like any other request.

    Fields after ``kv_ready`` are maintained by the engine; read them, don't set
    them.  ``num_computed``, ``num_output``, ``num_hashed`` and ``blocks`` are
    properties: a decoding request's progress is kept lazily by the engine and
    derived on read (O(1); ``blocks`` is O(blocks)).
    """

    req_id: str
    prompt_len: int
    max_output: int
    block_hashes: Sequence[int] = ()
    priority: int = 0
    arrival: float = 0.0
    output_token_ids: Callable[[int], Sequence[int]] | None = field(default=None, repr=False)
    prompt_tail: Sequence[int] = field(default=(), repr=False)
    kv_ready: bool = False  # prefill/decode disaggregation: see the class docstring

    status: str = field(default=WAITING, init=False)
    num_cached_tokens: int = field(default=-1, init=False)  # prefix hit at first scheduling (-1: not yet)
    num_preemptions: int = field(default=0, init=False)
    first_scheduled_at: float | None = field(default=None, init=False)
    first_token_at: float | None = field(default=None, init=False)
    finished_at: float | None = field(default=None, init=False)
    out_hashes: list[int] = field(default_factory=list, init=False, repr=False)  # hashes of full output blocks
    seq: int = field(default=0, init=False, repr=False)  # arrival order in this engine

    # -- engine state (private) ------------------------------------------------------
    _computed: int = field(default=0, init=False, repr=False)  # tokens whose KV is computed (at _base)
    _output: int = field(default=0, init=False, repr=False)  # tokens produced (at _base)
    _nblocks: int = field(default=0, init=False, repr=False)  # KV blocks held (when not decoding lazily)
    _hashed: int = field(default=0, init=False, repr=False)  # leading blocks already offered to the cache
    _ent: Any = field(default=None, init=False, repr=False)  # KV entries: (segment, first position) | (None, run)
    _cov: int = field(default=0, init=False, repr=False)  # blocks covered by _ent (the rest are uncached)
    _cur: Any = field(default=None, init=False, repr=False)  # segment holding block _cov - 1's hash, if not ours
    _kv: Any = field(default=None, init=False, repr=False)  # the KVPool holding its blocks
    _chain: Any = field(default=None, init=False, repr=False)  # list: prompt block hashes (+ output ones)
    _dc: DecodeClock | None = field(default=None, init=False, repr=False)  # set while decoding lazily
    _base: int = field(default=0, init=False, repr=False)  # decode counter at which _computed/_output hold
    _lazyhash: bool = field(default=False, init=False, repr=False)  # num_hashed becomes _NEVER at next full block
    _hashing: bool = field(default=False, init=False, repr=False)  # caches its output blocks
    _rpos: int = field(default=0, init=False, repr=False)  # running-order position (admission counter)
    _hent: Any = field(default=None, init=False, repr=False)  # its entry in the engine's finish heap

    # -- progress (derived while decoding lazily) ---------------------------------------
    @property
    def num_computed(self) -> int:
        """Tokens whose KV is computed (or hit)."""
        dc = self._dc
        return self._computed if dc is None else self._computed + dc.d - self._base

    @property
    def num_output(self) -> int:
        """Tokens produced so far."""
        dc = self._dc
        return self._output if dc is None else self._output + dc.d - self._base

    @property
    def num_hashed(self) -> int:
        """Leading blocks already offered to the prefix cache (a large sentinel: no more can be)."""
        h = self._hashed
        dc = self._dc
        if dc is not None and self._lazyhash and (self._computed + dc.d - self._base) // dc.bs > h:
            return _NEVER
        return h

    @property
    def num_blocks(self) -> int:
        """KV blocks held."""
        dc = self._dc
        if dc is None:
            return self._nblocks
        return -(-(self._computed + dc.d - self._base) // dc.bs)

    @property
    def blocks(self) -> list[int | None]:
        """KV blocks held, in order: the block's hash if it is in the prefix cache, else None.  O(blocks)."""
        n = self.num_blocks
        if not n:
            return []
        if not self._ent:
            return [None] * n
        return self._kv.block_list(self, n)

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
            return int(ph[i])
        fn = self.output_token_ids
        if fn is None or len(ph) != self.prompt_len // block_size:
            return None
        oh = self.out_hashes
        j = i - len(ph)
        while len(oh) <= j:
            start = (len(ph) + len(oh)) * block_size
            end = start + block_size
            p = self.prompt_len
            parent = oh[-1] if oh else (int(ph[-1]) if len(ph) else ROOT_HASH)
            toks: list[int] = []
            if start < p:
                base = p - len(self.prompt_tail)
                toks.extend(self.prompt_tail[start - base :])
            toks.extend(fn(end - p)[max(0, start - p) : end - p])
            oh.append(hash((parent, *toks)))
        return oh[j]

    # -- the hash chain the KV cache works on -------------------------------------------
    def can_hash_output(self, block_size: int) -> bool:
        """Whether blocks past the prompt have known hashes (output-block caching)."""
        return self.output_token_ids is not None and len(self.block_hashes) == self.prompt_len // block_size

    def chain(self, nblocks: int, block_size: int) -> list[int]:
        """The hashes of the first blocks, as far as known and at least ``nblocks`` if it can.

        The prompt's (``block_hashes`` itself if it is a list), then, with output-block
        caching, the output blocks' (appended in place: the list grows).
        """
        ch = self._chain
        if ch is None:
            ph = self.block_hashes
            if self.output_token_ids is not None and len(ph) == self.prompt_len // block_size:
                ch = [int(h) for h in ph]
            elif type(ph) is list:
                ch = ph
            elif hasattr(ph, "tolist"):
                ch = ph.tolist()
            else:
                ch = list(ph)
            self._chain = ch
        if nblocks > len(ch) and self.can_hash_output(block_size):
            for i in range(len(ch), nblocks):
                ch.append(self.block_hash(i, block_size))  # type: ignore[arg-type]
        return ch
