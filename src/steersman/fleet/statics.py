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


@dataclass(frozen=True, slots=True)
class FleetStatics:
    price_per_hour: np.ndarray
    tp: np.ndarray
    hbm_gb: np.ndarray  # per replica (tp x GPU HBM)
    tflops: np.ndarray  # per replica (tp x dense bf16)
    gpu_class: np.ndarray  # index into gpu_names (-1 unknown)
    gpu_names: tuple[str, ...]
    max_batched_tokens: np.ndarray
    max_seqs: np.ndarray
    kv_blocks: np.ndarray  # modelled KV capacity in blocks (NaN unknown)
    block_size: int
    modelled: np.ndarray  # bool: roofline coefficients are known
    coeff: dict[str, np.ndarray]  # roofline coefficients by name (see steersman.sim.roofline.Roofline)

    def step_time(self, idx: np.ndarray, tokens: np.ndarray, prefill_pairs: np.ndarray, prefill_kv: np.ndarray,
                  decode_kv: np.ndarray, sampled: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`Roofline.cost` duration for replicas ``idx`` (same formula, same constants)."""
        c = self.coeff
        g = lambda k: c[k][idx]  # noqa: E731
        lin = np.maximum(g("lin_c") * tokens + g("lin_c0"), g("lin_m"))
        pre = np.maximum(g("attn_c") * prefill_pairs, g("kv_m") * prefill_kv)
        dec = np.maximum(g("attn_c") * decode_kv, g("kv_m") * decode_kv)
        head = np.where(sampled > 0, np.maximum(g("head_c") * sampled, g("head_m")), 0.0)
        return lin + pre + dec + head + g("elt") * tokens + g("fixed") + g("ar_lat") + g("ar_tok") * tokens


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
    for a in (price, tp, hbm, tflops, mbt, mseq, kv, cls, modelled, *coeff.values()):
        a.flags.writeable = False
    return FleetStatics(price, tp, hbm, tflops, cls, tuple(names), mbt, mseq, kv, settings.block_size, modelled, coeff)
