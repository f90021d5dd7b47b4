"""Per-replica constants the scheduler needs, as arrays (built once per fleet layout).

For replicas whose GPU and model are known profiles, the engine model's roofline
coefficients (:class:`steersman.sim.Roofline`) are laid out as arrays so a
policy can predict step times for every candidate in one vectorised expression.
Unknown hardware gets NaN coefficients; predictors then fall back to the
latencies observed on that replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from steersman.config import DEFAULTS, EngineSettings
from steersman.sim import gpu_profile, model_profile
from steersman.sim.memory import batch_limits, num_kv_blocks
from steersman.sim.roofline import Roofline

__all__ = ["ReplicaSpec", "FleetStatics", "build_statics"]

_COEFFS = ("lin_c", "lin_c0", "lin_m", "elt", "fixed", "attn_c", "kv_m", "head_c", "head_m", "ar_lat", "ar_tok")


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """What configuration says about a replica (enough to model it)."""

    gpu: str | None
    model: str | None
    tp: int
    price_per_hour: float
    #: prefill/decode disaggregation (the twin): seconds per prompt token to move a request's KV from this
    #: prefill replica to a decode one (KV bytes per token / the link); 0 for a replica that decodes itself
    handoff_s_per_token: float = 0.0
    #: the engine kind (``llamacpp``, ``vllm``...) and pool: with gpu, model, tp and hand-off they say which replicas
    #: are alike (FleetStatics.speed_class)
    kind: str = ""
    pool: str = ""


@dataclass(frozen=True, slots=True)
class FleetStatics:
    price_per_hour: np.ndarray
    tp: np.ndarray
    hbm_gb: np.ndarray  # per replica (tp x GPU HBM)
    tflops: np.ndarray  # per replica (tp x dense bf16)
    gpu_class: np.ndarray  # index into gpu_names (-1 unknown)
    gpu_names: tuple[str, ...]
    max_batched_tokens: np.ndarray
    batch_tokens: np.ndarray  # max_batched_tokens, vLLM's small-GPU default 2048 where unknown
    compute_price: np.ndarray  # $/h per dense TFLOP/s (NaN-free; unknown GPUs rank last)
    max_seqs: np.ndarray
    kv_blocks: np.ndarray  # modelled KV capacity in blocks (NaN unknown)
    block_size: int
    modelled: np.ndarray  # bool: roofline coefficients are known
    coeff: dict[str, np.ndarray]  # roofline coefficients by name (see steersman.sim.roofline.Roofline)
    #: the same, folded for speed, one row each: lin_c, lin_c0, lin_m, per-token (elementwise + all-reduce),
    #: fixed (per step + all-reduce latency), attn_c, kv_m, decode-KV (max(attn_c, kv_m)), head_c, head_m,
    #: then the KV hand-off seconds per prompt token (ReplicaSpec.handoff_s_per_token)
    matrix: np.ndarray
    #: replicas configured alike (engine kind, GPU, model, TP, pool, hand-off) share a class; an unprofiled replica's
    #: learnt decode speed is pooled over its class (steersman.policy.predict.pooled_tpot)
    speed_class: np.ndarray

    def step_time(self, idx: np.ndarray, tokens: np.ndarray, prefill_pairs: np.ndarray, prefill_kv: np.ndarray,
                  decode_kv: np.ndarray, sampled: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`Roofline.cost` duration for replicas ``idx`` (same formula, same constants)."""
        lin_c, lin_c0, lin_m, per_tok, fixed, attn_c, kv_m, dec_kv, head_c, head_m = self.matrix[:10, idx]
        t = np.maximum(lin_c * tokens + lin_c0, lin_m)
        t += np.maximum(attn_c * prefill_pairs, kv_m * prefill_kv)
        t += dec_kv * decode_kv
        t += np.where(sampled > 0, np.maximum(head_c * sampled, head_m), 0.0)
        t += per_tok * tokens
        t += fixed
        return t


def build_statics(specs: Sequence[ReplicaSpec], settings: EngineSettings = DEFAULTS.engine) -> FleetStatics:
    n = len(specs)
    coeff = {k: np.full(n, np.nan) for k in _COEFFS}
    price = np.array([s.price_per_hour for s in specs], dtype=float)
    tp = np.array([s.tp for s in specs], dtype=float)
    hbm = np.full(n, np.nan)
    tflops = np.full(n, np.nan)
    mbt = np.full(n, np.nan)
    mseq = np.full(n, np.nan)
    kv = np.full(n, np.nan)
    modelled = np.zeros(n, dtype=bool)
    names: list[str] = []
    cls = np.full(n, -1, dtype=np.int32)
    for i, s in enumerate(specs):
        try:
            gpu = gpu_profile(s.gpu) if s.gpu else None
        except KeyError:
            gpu = None
        if gpu is None:
            continue
        if gpu.name not in names:
            names.append(gpu.name)
        cls[i] = names.index(gpu.name)
        hbm[i] = gpu.hbm_gb * s.tp
        tflops[i] = gpu.bf16_tflops * s.tp
        try:
            model = model_profile(s.model) if s.model else None
        except KeyError:
            model = None
        if model is None:
            continue
        es = replace(settings, tensor_parallel=s.tp)
        try:
            mbt[i], mseq[i] = batch_limits(gpu, es)
            kv[i] = num_kv_blocks(gpu, model, es, int(mbt[i]), int(mseq[i]))
        except ValueError:
            continue  # the model does not fit this replica: leave it unmodelled
        for k, v in Roofline(gpu, model, s.tp, settings.step_overhead_s).coefficients().items():
            coeff[k][i] = v
        modelled[i] = True
    c = coeff
    matrix = np.vstack([
        c["lin_c"], c["lin_c0"], c["lin_m"], c["elt"] + c["ar_tok"], c["fixed"] + c["ar_lat"],
        c["attn_c"], c["kv_m"], np.maximum(c["attn_c"], c["kv_m"]), c["head_c"], c["head_m"],
        np.array([s.handoff_s_per_token for s in specs], dtype=float),
    ])
    for a in (price, tp, hbm, tflops, mbt, mseq, kv, cls, modelled, matrix, *coeff.values()):
        a.flags.writeable = False
    batch_tokens = np.where(np.isnan(mbt), 2048.0, mbt)
    compute_price = np.where(np.isnan(tflops), np.inf, price / np.fmax(np.nan_to_num(tflops, nan=1.0), 1e-9))
    keys: dict[tuple, int] = {}
    speed_class = np.array([keys.setdefault((s.kind, s.gpu, s.model, s.tp, s.pool, s.handoff_s_per_token), len(keys))
                            for s in specs], dtype=np.intp)
    for a in (batch_tokens, compute_price, speed_class):
        a.flags.writeable = False
    return FleetStatics(price, tp, hbm, tflops, cls, tuple(names), mbt, batch_tokens, compute_price, mseq, kv,
                        settings.block_size, modelled, coeff, matrix, speed_class)
