"""Hand-built fleet snapshots and requests, for testing policies and plugins without a gateway.

>>> snap = fleet_snapshot(["H100", "A100"], in_flight=[3, 0])
>>> req = sched_request(prompt_tokens=800)
>>> make_policy("steersman").pick(snap, req)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from steersman.fleet import snapshot as S
from steersman.fleet.prefix_index import PrefixIndex
from steersman.fleet.snapshot import FleetSnapshot
from steersman.fleet.statics import ReplicaSpec, build_statics
from steersman.policy.request import LatencyBudget, PriorityClass, SchedRequest, WorkflowView
from steersman.sim import gpu_profile

__all__ = ["MODEL", "fleet_snapshot", "sched_request", "chain", "prefix_index"]

MODEL = "llama-3.1-8b"
BLOCK = 16


@functools.cache
def _statics(gpus: tuple[str, ...], model: str):
    return build_statics([ReplicaSpec(g, model, 1, gpu_profile(g).price_per_hour) for g in gpus])


def fleet_snapshot(gpus: Sequence[str] | int, *, model: str = MODEL, time: float = 0.0, prefix: PrefixIndex | None = None,
                   routable: Sequence[bool] | None = None, **rows: Sequence[float] | float) -> FleetSnapshot:
    """A snapshot of replicas of ``model`` on ``gpus`` (names, or a count of H100s).

    ``rows`` set live fields by name (``in_flight=[...]``, ``kv_usage=0.9``...); metrics
    count as fresh at ``time`` unless ``scraped_at`` is given.
    """
    names = tuple(["H100"] * gpus) if isinstance(gpus, int) else tuple(gpus)
    n = len(names)
    live = np.zeros((len(S.LIVE_FIELDS), n))
    live[S.WEIGHTS] = S.WEIGHTS_CODES["warm"]
    live[S.SCRAPED_AT] = time
    for row in (S.KV_BLOCKS_TOTAL, S.TTFT_EWMA, S.TPOT_EWMA, S.STALLED_SINCE):
        live[row] = np.nan
    live[S.TTFT_RATIO] = live[S.TPOT_RATIO] = live[S.PREFIX_ACCURACY] = 1.0
    for name, values in rows.items():
        live[S.LIVE_FIELDS.index(name)] = values
    ok = np.ones(n, dtype=bool) if routable is None else np.asarray(routable, dtype=bool)
    return FleetSnapshot(
        time=time, names=tuple(f"r{i}" for i in range(n)), gpus=names, pools=("p",) * n,
        model_masks={model: np.ones(n, dtype=bool)}, healthy=np.ones(n, dtype=bool), routable=ok,
        live=live, statics=_statics(names, model), prefix=prefix,
    )


def chain(tag: object, blocks: int) -> tuple[int, ...]:
    """Distinct stand-in block hashes for a prompt of ``blocks`` full blocks."""
    return tuple(hash((tag, i)) for i in range(blocks))


def prefix_index(n: int, held: dict[int, Sequence[int]] | None = None, max_bytes: float = 8 << 20) -> PrefixIndex:
    """A prefix index over ``n`` replicas where ``held[replica]`` was recorded."""
    idx = PrefixIndex(n, max_bytes)
    for r, hs in (held or {}).items():
        idx.record(r, hs)
    return idx


def sched_request(seq: int = 0, *, model: str = MODEL, prompt_tokens: int | None = None, hashes: Sequence[int] = (),
                  expected_output: int = 200, max_tokens: int | None = None, priority: PriorityClass = PriorityClass.STANDARD,
                  budget: LatencyBudget = LatencyBudget(), workflow: WorkflowView | None = None, tenant: str = "t",
                  arrival: float = 0.0) -> SchedRequest:
    tokens = len(hashes) * BLOCK if prompt_tokens is None else prompt_tokens
    return SchedRequest(seq=seq, model=model, kind="chat", stream=True, tenant=tenant, priority=priority, arrival=arrival,
                        prompt_tokens=tokens, block_hashes=tuple(hashes), max_tokens=max_tokens,
                        expected_output=expected_output, budget=budget, workflow=workflow)
