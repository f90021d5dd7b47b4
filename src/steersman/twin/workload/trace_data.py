"""Loading replay traces: Azure LLM inference 2023 (CSV) and Mooncake (JSONL) into :class:`TraceData`.

Mooncake ``hash_ids`` (one per 512-token block) are chained on load: an id is
identified together with the ids before it, so equal chain ids mean equal
prefixes.  Replay itself is :mod:`.traces`.
"""

from __future__ import annotations

import csv
import functools
import os
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import numpy as np
import orjson

__all__ = ["TraceData", "TraceError", "load_trace", "MOONCAKE_BLOCK"]

MOONCAKE_BLOCK = 512


class TraceError(ValueError):
    pass


@dataclass(frozen=True, eq=False)
class TraceData:
    """A loaded trace (shared by every source that replays it)."""

    path: str
    format: str  # "azure" | "mooncake"
    times: np.ndarray  # seconds since the first request, non-decreasing
    prompt: np.ndarray  # int64 prompt tokens (>= 1)
    output: np.ndarray  # int64 output tokens (>= 1)
    chain_ptr: np.ndarray | None = None  # request i's 512-token chains are chains[chain_ptr[i]:chain_ptr[i+1]]
    chains: np.ndarray | None = None  # dense chain ids (an id together with its prefix)
    chain_depth: np.ndarray | None = None  # position of each chain in its prompts (in 512-token blocks)
    chain_last: np.ndarray | None = None  # last request using each chain
    _cache: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return int(self.times.size)

    @property
    def n_chains(self) -> int:
        return 0 if self.chain_depth is None else int(self.chain_depth.size)

    def new_prompt_tokens(self, block_size: int = 16) -> np.ndarray:
        """Per request: prompt tokens past the longest full-block prefix an earlier request already had."""
        got = self._cache.get(block_size)
        if got is not None:
            return got
        if self.chains is None:
            out = self.prompt.copy()
        else:
            sub = MOONCAKE_BLOCK // block_size
            seen: dict[int, int] = {}
            out = np.empty_like(self.prompt)
            ptr = self.chain_ptr.tolist()
            chains = self.chains.tolist()
            for i, p in enumerate(self.prompt.tolist()):
                nfull = p // block_size
                matched = 0
                cs = chains[ptr[i]:ptr[i + 1]]
                for j, c in enumerate(cs):
                    k = min(seen.get(c, 0), nfull - j * sub)
                    matched += max(k, 0)
                    if k < sub:
                        break
                out[i] = p - block_size * matched
                for j, c in enumerate(cs):
                    have = min(sub, nfull - j * sub)
                    if have <= 0:
                        break
                    if seen.get(c, 0) < have:
                        seen[c] = have
        out.setflags(write=False)
        self._cache[block_size] = out
        return out


def _count(v, name: str) -> int:
    """A token count of a trace record: an integer >= 0 (a negative one was simulated as one token)."""
    n = int(v)
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return n


def _azure_seconds(stamp: str, day0: int) -> float:
    d, _, tm = stamp.strip().partition(" ")
    h, m, s = tm.split(":")
    return (date.fromisoformat(d).toordinal() - day0) * 86400.0 + int(h) * 3600 + int(m) * 60 + float(s)


def _load_azure(path: Path) -> TraceData:
    with path.open(newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's byte-order mark is not the header
        rows = csv.reader(f)
        header = next(rows, None)
        want = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
        if header is None or [h.strip() for h in header[:3]] != want:
            raise TraceError(f"{path}: expected an Azure LLM trace with header {','.join(want)}, got {header!r}")
        ts, pr, out = [], [], []
        day0 = None
        for n, r in enumerate(rows, 2):
            if not r or (len(r) == 1 and not r[0].strip()):  # a blank or whitespace-only line
                continue
            try:
                if len(r) < 3:
                    raise ValueError(f"{len(r)} column(s), expected 3 ({', '.join(want)})")
                if day0 is None:
                    day0 = date.fromisoformat(r[0].strip().partition(" ")[0]).toordinal()
                ts.append(_azure_seconds(r[0], day0))
                pr.append(_count(r[1], "ContextTokens"))
                out.append(_count(r[2], "GeneratedTokens"))
            except (ValueError, IndexError) as e:
                raise TraceError(f"{path}:{n}: bad row {r!r}: {e}") from None
    if not ts:
        raise TraceError(f"{path}: no requests")
    t = np.asarray(ts)
    order = np.argsort(t, kind="stable")
    t = t[order] - t[order[0]]
    return TraceData(str(path), "azure", t, np.maximum(np.asarray(pr, np.int64)[order], 1),
                     np.maximum(np.asarray(out, np.int64)[order], 1))


def _load_mooncake(path: Path) -> TraceData:
    ts, pr, out, ptr, chains = [], [], [], [0], []
    dense: dict[tuple[int, int], int] = {}
    depth: list[int] = []
    last: list[int] = []
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = orjson.loads(line)
                if not isinstance(r, dict):
                    raise ValueError(f"a record is a JSON object (timestamp, input_length, output_length, hash_ids), "
                                     f"got {type(r).__name__}")
                missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in r]
                if missing:
                    raise ValueError(f"missing field(s) {', '.join(missing)}")
                t, ids = float(r["timestamp"]), r["hash_ids"]
                p, o = _count(r["input_length"], "input_length"), _count(r["output_length"], "output_length")
                if not isinstance(ids, list):
                    raise ValueError("hash_ids must be a list")
                for j, x in enumerate(ids):
                    if type(x) is not int:  # not a float (int() would truncate it) nor a bool
                        raise ValueError(f"hash_ids[{j}] must be an integer, got {x!r}")
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise TraceError(f"{path}:{n}: bad record: {e}") from None
            i = len(ts)
            ts.append(t / 1000.0)
            pr.append(p)
            out.append(o)
            parent = -1
            for j, x in enumerate(ids):
                key = (parent, x)
                c = dense.get(key)
                if c is None:
                    c = dense[key] = len(depth)
                    depth.append(j)
                    last.append(i)
                else:
                    last[c] = i
                chains.append(c)
                parent = c
            ptr.append(len(chains))
    if not ts:
        raise TraceError(f"{path}: no requests")
    t = np.asarray(ts)
    if np.any(np.diff(t) < 0):
        raise TraceError(f"{path}: timestamps must be non-decreasing (Mooncake traces keep multi-turn order)")
    return TraceData(str(path), "mooncake", t - t[0], np.maximum(np.asarray(pr, np.int64), 1),
                     np.maximum(np.asarray(out, np.int64), 1), np.asarray(ptr, np.int64), np.asarray(chains, np.int64),
                     np.asarray(depth, np.int64), np.asarray(last, np.int64))


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, fmt: str, mtime: float, size: int) -> TraceData:
    p = Path(path)
    try:
        return _load_azure(p) if fmt == "azure" else _load_mooncake(p)
    except OSError as e:  # unreadable (permissions, ...)
        raise TraceError(f"cannot read trace {p}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"{p}: not UTF-8 text: {e}") from None


def load_trace(path: str | os.PathLike, format: str = "auto") -> TraceData:
    """Load (and cache) a trace; ``format`` is ``azure``, ``mooncake`` or ``auto`` (by extension: .csv / .jsonl)."""
    p = Path(path)
    if format == "auto":
        suffix = p.suffix.lower()
        format = {".csv": "azure", ".jsonl": "mooncake", ".json": "mooncake"}.get(suffix, "")
        if not format:
            raise TraceError(f"{p}: cannot tell the trace format from the extension: name it .csv (Azure) or .jsonl "
                             "(Mooncake), or replay it from a workload spec with format: azure | mooncake")
    if format not in ("azure", "mooncake"):
        raise TraceError(f"trace format must be azure, mooncake or auto, got {format!r}")
    try:
        st = p.stat()
    except OSError as e:
        raise TraceError(f"cannot read trace {p}: {e.strerror or e}") from None
    if p.is_dir():
        raise TraceError(f"cannot read trace {p}: it is a directory, not a file")
    return _load_cached(str(p.resolve()), format, st.st_mtime, st.st_size)
