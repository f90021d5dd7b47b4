"""Hand-built snapshots and requests for the baseline-profile tests (imported as ``baselinehelpers``)."""

from __future__ import annotations

import functools

import numpy as np

from steersman.fleet import snapshot as S
from steersman.fleet.prefix_index import PrefixIndex
from steersman.fleet.snapshot import FleetSnapshot
from steersman.fleet.statics import ReplicaSpec, build_statics
from steersman.policy.request import PriorityClass, SchedRequest

MODEL = "llama-3.1-8b"
BS = 16


@functools.cache
def _statics(n: int, gpu: str):
    return build_statics([ReplicaSpec(gpu, MODEL, 1, 2.0)] * n)


def snapshot(n: int, prefix: PrefixIndex | None = None, routable=None, gpu: str = "H100", **rows) -> FleetSnapshot:
    """A fleet of ``n`` identical replicas; ``rows`` set live fields by name (e.g. ``in_flight=[...]``)."""
    live = np.zeros((len(S.LIVE_FIELDS), n))
    live[S.WEIGHTS] = S.WEIGHTS_CODES["warm"]
    for name in ("kv_blocks_total", "ttft_ewma", "tpot_ewma", "stalled_since"):
        live[S.LIVE_FIELDS.index(name)] = np.nan
    for name in ("ttft_ratio", "tpot_ratio"):
        if name in S.LIVE_FIELDS:
            live[S.LIVE_FIELDS.index(name)] = 1.0
    for name, values in rows.items():
        live[S.LIVE_FIELDS.index(name)] = values
    ok = np.ones(n, dtype=bool) if routable is None else np.asarray(routable, dtype=bool)
    return FleetSnapshot(
        time=0.0, names=tuple(f"r{i}" for i in range(n)), gpus=(gpu,) * n, pools=("p",) * n,
        model_masks={MODEL: np.ones(n, dtype=bool)}, healthy=np.ones(n, dtype=bool), routable=ok,
        live=live, statics=_statics(n, gpu), prefix=prefix,
    )


def chain(tag: object, blocks: int) -> tuple[int, ...]:
    """Distinct stand-in block hashes (what matters is equality, not the chaining)."""
    return tuple(hash((tag, i)) for i in range(blocks))


def request(seq: int = 0, hashes: tuple[int, ...] = (), prompt_tokens: int | None = None,
            expected_output: int = 200) -> SchedRequest:
    tokens = len(hashes) * BS if prompt_tokens is None else prompt_tokens
    return SchedRequest(seq=seq, model=MODEL, kind="chat", stream=False, tenant="t", priority=PriorityClass.STANDARD,
                        arrival=0.0, prompt_tokens=tokens, block_hashes=tuple(hashes), max_tokens=None,
                        expected_output=expected_output)


def index(n: int, held: dict[int, tuple[int, ...]] | None = None) -> PrefixIndex:
    """A prefix index over ``n`` replicas with ``held[replica]`` recorded."""
    idx = PrefixIndex(n, 8 << 20)
    for r, hs in (held or {}).items():
        idx.record(r, hs)
    return idx
