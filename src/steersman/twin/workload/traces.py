"""Trace replay: Azure LLM inference 2023 (CSV) and Mooncake (JSONL), open loop, with a time-scale knob.

* **Azure** (``TIMESTAMP,ContextTokens,GeneratedTokens``): no prefix information,
  so every prompt is unique (its own hash namespace).
* **Mooncake** (``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``):
  one hash id per 512-token block, equal leading ids = shared prefix.  Each id
  becomes ``512 / block_size`` chained block hashes (32 of 16 tokens), truncated
  to the prompt's full blocks.  Ids are chained on load (an id is identified
  together with the ids before it), so equal hashes mean equal prefixes even if
  a trace reused an id after a different prefix.

Knobs: ``speed`` (4 replays four times faster: inter-arrival times divided by
4), ``limit`` (at most this many requests), ``offset_s`` (virtual time of the
first request), ``repeat`` (play the trace this many times back to back, each
repetition with fresh prompts), ``end_s`` (drop arrivals at or after it), a
daily ``curve`` (the trace's timeline is warped so its rate follows the curve),
``tenant`` / ``slo`` (a name, or a mapping name -> weight drawn per request),
``max_tokens`` (``None``: requests give no limit; an int: they ask for it and
outputs are capped; ``"exact"``: they ask for exactly their output length) and
``deadline_s``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from steersman.twin.workload.base import OfferedLoad, Source, SourceInfo, _Draft
from steersman.twin.workload.curve import DailyCurve
from steersman.twin.workload.hashing import MAX_KEYS, block_hashes, mask, masks_np, positions, source_namespace
from steersman.twin.workload.trace_data import MOONCAKE_BLOCK, TraceData, TraceError, load_trace

__all__ = ["TraceData", "TraceSource", "load_trace", "TraceError", "MOONCAKE_BLOCK"]

_CHUNK = 256  # requests whose hashes are built together


def _choices(spec: str | Mapping[str, float] | None, what: str) -> tuple[list, np.ndarray | None]:
    """(names, weights) for a label that is fixed (weights None) or drawn per request."""
    if spec is None or isinstance(spec, str):
        return [spec], None
    if not isinstance(spec, Mapping) or not spec:
        raise TraceError(f"{what} must be a name or a non-empty mapping name -> weight")
    names = list(spec)
    w = np.asarray([spec[n] for n in names], dtype=float)
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise TraceError(f"{what} weights must be >= 0 and not all 0")
    return names, w / w.sum()


class TraceSource(Source):
    """Open-loop replay of a trace (see the module docstring for the knobs)."""

    def __init__(
        self,
        trace: TraceData | str | os.PathLike,
        *,
        tenant: str | Mapping[str, float] = "default",
        model: str = "default",
        seed: int | np.random.SeedSequence = 0,
        speed: float = 1.0,
        limit: int | None = None,
        offset_s: float = 0.0,
        repeat: int = 1,
        slo: str | Mapping[str, float] | None = None,
        max_tokens: int | str | None = None,
        deadline_s: float | None = None,
        curve: DailyCurve | None = None,
        end_s: float | None = None,
        name: str | None = None,
        block_size: int = 16,
        format: str = "auto",
    ) -> None:
        data = trace if isinstance(trace, TraceData) else load_trace(trace, format)
        self._tenants, self._tenant_w = _choices(tenant, "tenant")
        super().__init__(name or Path(data.path).stem, self._tenants[0], model)
        if not (isinstance(speed, (int, float)) and speed > 0 and math.isfinite(speed)):
            raise TraceError(f"speed must be > 0, got {speed!r}")
        if limit is not None and (not isinstance(limit, int) or limit < 1):  # (0: a run of nothing)
            raise TraceError(f"limit must be an integer >= 1, got {limit!r}")
        if not isinstance(repeat, int) or repeat < 1:
            raise TraceError(f"repeat must be an integer >= 1, got {repeat!r}")
        if not (max_tokens is None or max_tokens == "exact" or (isinstance(max_tokens, int) and max_tokens >= 1)):
            raise TraceError(f"max_tokens must be null, an integer >= 1 or 'exact', got {max_tokens!r}")
        if not isinstance(block_size, int) or block_size < 1 or (data.format == "mooncake" and MOONCAKE_BLOCK % block_size):
            raise TraceError(f"block_size must divide {MOONCAKE_BLOCK} for a Mooncake trace, got {block_size!r}")
        if data.format == "mooncake" and data.n_chains * repeat >= MAX_KEYS:
            raise TraceError("too many repetitions of this trace")
        self.data = data
        self.seed = seed
        self.speed = float(speed)
        self.limit = limit
        self.offset_s = float(offset_s)
        self.repeat = repeat
        self._slos, self._slo_w = _choices(slo, "slo")
        self.slo = self._slos[0] if self._slo_w is None else None
        self.max_tokens = max_tokens
        self.deadline_s = deadline_s
        self.curve = curve
        self.end_s = math.inf if end_s is None else float(end_s)
        self.block_size = block_size
        self._ptr = 0
        self._inflight: set[int] = set()  # seqs sent and not completed
        self._fresh: list = []  # sent since the last completion: numbered by now, not yet in _inflight

    # ----- setup
    def _on_bind(self) -> None:
        d = self.data
        N = len(d)
        span = float(d.times[-1])
        period = span + (span / (N - 1) if N > 1 and span > 0 else 1.0)  # the next repetition starts a mean gap later
        total = N * self.repeat
        if self.limit is not None:
            total = min(total, self.limit)
        g = np.arange(total)
        loc = g % N
        rep = g // N
        u = (d.times[loc] + rep * period) / self.speed
        t = self.curve.warp(self.curve.cumulative(self.offset_s) + u) if self.curve is not None else self.offset_s + u
        t = np.asarray(t, dtype=float)
        if self.end_s < math.inf:
            keep = int(np.searchsorted(t, self.end_s, "left"))
            t, loc, rep = t[:keep], loc[:keep], rep[:keep]
        self._t = t
        self._loc = loc
        self._rep = rep
        self._n = int(t.size)
        out = d.output[loc]
        if isinstance(self.max_tokens, int):
            out = np.minimum(out, self.max_tokens)
        self._out = out
        self._prompt = d.prompt[loc]
        ss = self.seed if isinstance(self.seed, np.random.SeedSequence) else np.random.SeedSequence(self.seed)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, 0))))
        self._tenant_i = rng.choice(len(self._tenants), self._n, p=self._tenant_w) if self._tenant_w is not None else None
        self._slo_i = rng.choice(len(self._slos), self._n, p=self._slo_w) if self._slo_w is not None else None
        self._hstart = self._hend = 0
        self._chunk: tuple = ()
        self._chain_cache: dict[int, tuple[list, np.ndarray]] = {}  # repetition -> (chain -> hashes, built?)
        if d.format == "mooncake":
            self._req_chains = [a.tolist() for a in np.split(d.chains, d.chain_ptr[1:-1])]

    def _info(self) -> SourceInfo:
        params = {"path": self.data.path, "speed": self.speed, "limit": self.limit, "offset_s": self.offset_s,
                  "repeat": self.repeat, "requests": self._n, "max_tokens": self.max_tokens,
                  "deadline_s": self.deadline_s, "curve": self.curve, "model": self.model,
                  "tenants": self._tenants if self._tenant_w is None else dict(zip(self._tenants, self._tenant_w.tolist())),
                  "slo": self._slos[0] if self._slo_w is None else dict(zip(self._slos, self._slo_w.tolist()))}
        return SourceInfo(self.index, self.name, self.data.format, self._tenants[0], self.slo, False, params)

    # ----- block hashes, a chunk of requests at a time
    def _materialise(self, g0: int) -> None:
        g1 = min(g0 + _CHUNK, self._n)
        bs = self.block_size
        nfull = (self._prompt[g0:g1] // bs).tolist()
        if self.data.format == "azure":
            hashes = self._azure_hashes(g0, g1, nfull)
        else:
            hashes = self._mooncake_hashes(g0, g1, nfull)
        sl = slice(g0, g1)
        tl = self._t[sl].tolist()
        pr = self._prompt[sl].tolist()
        out = self._out[sl].tolist()
        if self.max_tokens is None:
            mx = [None] * (g1 - g0)
        elif self.max_tokens == "exact":
            mx = out
        else:
            mx = [self.max_tokens] * (g1 - g0)
        ten = ([self._tenants[0]] * (g1 - g0) if self._tenant_i is None
               else [self._tenants[i] for i in self._tenant_i[sl].tolist()])
        slo = [self._slos[0]] * (g1 - g0) if self._slo_i is None else [self._slos[i] for i in self._slo_i[sl].tolist()]
        self._chunk = (tl, pr, out, mx, ten, slo, hashes)
        self._hstart, self._hend = g0, g1

    def _azure_hashes(self, g0: int, g1: int, nfull: list[int]) -> list[tuple[int, ...]]:
        n = np.asarray(nfull, dtype=np.int64)
        keys = (np.uint64(self.index + 1) << np.uint64(44)) | (np.arange(g0, g1, dtype=np.uint64) << np.uint64(12))
        total = int(n.sum())
        offs = np.concatenate(([0], np.cumsum(n)))
        pos = np.arange(total) - np.repeat(offs[:-1], n)
        flat = (np.repeat(masks_np(keys), n) ^ positions(int(n.max()) if total else 0)[pos]).tolist()
        o = offs.tolist()
        return [tuple(flat[o[i]:o[i + 1]]) for i in range(g1 - g0)]

    def _mooncake_hashes(self, g0: int, g1: int, nfull: list[int]) -> list[tuple[int, ...]]:
        """Each request's hashes are its chains' 32-block tuples (built once per chain, shared), truncated."""
        d = self.data
        N = len(d)
        sub = MOONCAKE_BLOCK // self.block_size
        ptr = d.chain_ptr
        caches = self._chain_cache
        rc = self._req_chains
        out: list[tuple[int, ...]] = []
        g = g0
        while g < g1:  # one repetition at a time: its requests are consecutive trace rows l0..l1
            r, l0 = divmod(g, N)
            l1 = min(l0 + (g1 - g), N)
            got = caches.get(r)
            if got is None:
                got = caches[r] = ([None] * d.n_chains, np.zeros(d.n_chains, dtype=bool))
            cache, have = got
            need = np.unique(d.chains[ptr[l0]:ptr[l1]])
            missing = need[~have[need]]
            if missing.size:
                keys = ((np.uint64(self.index + 1) << np.uint64(44)) | ((missing + r * d.n_chains).astype(np.uint64)
                        << np.uint64(12)) | np.uint64(1))
                depth = d.chain_depth[missing]
                grid = positions(int(depth.max() + 1) * sub).reshape(-1, sub)[depth] ^ masks_np(keys)[:, None]
                flat = grid.ravel().tolist()
                for i, c in enumerate(missing.tolist()):
                    cache[c] = tuple(flat[i * sub:(i + 1) * sub])
                have[missing] = True
            for loc in range(l0, l1):
                n = nfull[g - g0]
                lst: list[int] = []
                ext = lst.extend
                for c in rc[loc]:
                    ext(cache[c])
                if len(lst) > n:
                    del lst[n:]
                elif len(lst) < n:  # prompt longer than its hash ids cover: the rest is its own
                    lst.extend(block_hashes(mask(source_namespace(self.index, g, 2)), len(lst), n))
                out.append(tuple(lst))
                g += 1
            # forget chains no later request of this repetition uses
            done = need[d.chain_last[need] < l1]
            for c in done.tolist():
                cache[c] = None
            have[done] = False
            if l1 == N:
                del caches[r]
        return out

    # ----- hooks
    def _peek(self) -> float:
        p = self._ptr
        return float(self._t[p]) if p < self._n else math.inf

    def _pull(self, until: float) -> list[_Draft]:
        p = self._ptr
        n = self._n
        if p >= n or self._t[p] >= until:
            return []
        j = int(np.searchsorted(self._t, until, "left"))
        out: list[_Draft] = []
        app = out.append
        model, deadline, idx = self.model, self.deadline_s, self.index
        st = self._st
        g = p
        while g < j:
            if g >= self._hend:
                self._materialise(g)
            tl, pr, op, mx, ten, slo, hs = self._chunk
            h0 = self._hstart
            stop = min(j, self._hend)
            for i in range(g - h0, stop - h0):
                app(_Draft(tl[i], 0, ten[i], model, pr[i], hs[i], op[i], mx[i], slo[i], deadline, None, None, None, 0, idx))
            g = stop
        st.emitted += j - p
        self._ptr = j
        self._fresh += out  # their seqs are given after this returns (by this source or its mix)
        return out

    def _follow(self, a, finished_at: float, ok: bool) -> list[_Draft]:
        if a.source != self.index or a.workflow is not None:
            raise ValueError(f"on_complete for an arrival this trace did not send: seq {a.seq}")
        inflight = self._inflight
        if self._fresh:
            inflight.update([d.seq for d in self._fresh])
            self._fresh = []
        try:
            inflight.remove(a.seq)
        except KeyError:
            raise ValueError(f"on_complete for an arrival that is not in flight: seq {a.seq}") from None
        st = self._st
        if ok:
            st.completed += 1
        else:
            st.failed += 1
        return []

    def _idle(self) -> bool:
        st = self._st
        return self._ptr >= self._n and st.completed + st.failed >= st.emitted

    def _load(self, t0: float | None, t1: float | None, latency_s: float) -> OfferedLoad:
        t = self._t
        if self._n == 0:
            return OfferedLoad()
        new = self.data.new_prompt_tokens(self.block_size)[self._loc]
        if t0 is None or t1 is None:
            a, b = 0, self._n
            span = float(t[-1] - t[0])
            dur = span * self._n / (self._n - 1) if self._n > 1 and span > 0 else 1.0
        else:
            a, b = (int(x) for x in np.searchsorted(t, [t0, t1], "left"))
            dur = t1 - t0
            if dur <= 0:
                return OfferedLoad()
        sl = slice(a, b)
        return OfferedLoad((b - a) / dur, float(self._prompt[sl].sum()) / dur, float(self._out[sl].sum()) / dur,
                           float(new[sl].sum()) / dur, 0.0)
