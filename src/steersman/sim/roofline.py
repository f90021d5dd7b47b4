"""Step time of one forward pass from a calibrated roofline.

A step runs every scheduled token of the batch through the model once.  Its time
is a sum over parts, each the max of a compute side and a memory side (the part
is limited by whichever is slower), plus terms that are neither:

=================  ======================================  ===========================================
part               compute side (FLOPs / (peak x mfu))       memory side (bytes / (HBM BW x bw_eff))
=================  ======================================  ===========================================
linear layers      2 x linear params x (T + T0) per layer    linear weights, read once per step
prefill attention  4 x L x heads x hd x sum c (s + c/2)      KV of the chunk and its prefix (s + c)
decode attention   4 x L x heads x hd x sum context          the whole KV of each decoding request
LM head            2 x hidden x vocab per sampled token      the LM-head weights (if anything is sampled)
elementwise        --                                        T x activation bytes (norms, RoPE, act, add),
                                                             at ``elt_eff`` of the HBM bandwidth
=================  ======================================  ===========================================

plus ``L x layer_floor_s`` (minimum kernel times), the tensor-parallel all-reduces
(2 per layer, ring: latency + 2(tp-1)/tp x T x hidden x dtype / (link BW x ar_eff))
and the engine's fixed per-step overhead.  With tensor parallelism every GPU does
1/tp of the linear and attention work and holds 1/tp of the weights and KV heads.

T0 (``gemm_ramp_tokens``, scaled by ``tp ** 0.25``) keeps the model a roofline but
bends the knee: a pure max() underestimates GEMMs of a few hundred tokens badly
because tiles and waves are quantised (e.g. H100, Llama-2-7B, 256 tokens: 0.156 ms
memory-bound predicted vs 0.26 ms measured per layer).  Compute time affine in
tokens, FLOPs x (T + T0) / T, is the same as an MFU ramping up with T.  The ramp
grows with tp because the per-GPU GEMMs get narrower (fewer tiles per wave); the
exponent 0.25 is the least-squares value of both fitted GPUs rounded.

:class:`Roofline` precomputes the coefficients of one replica (gpu, model, tp) so
the engine pays a dozen float operations per step; :func:`predict_step` and
:func:`linear_layer_time` are the same model for callers that want to predict a
hypothetical batch or check the calibration.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from steersman.sim.gpus import GpuProfile
from steersman.sim.models import ModelProfile

__all__ = ["Roofline", "StepCost", "predict_step", "linear_layer_time", "elementwise_bytes_per_token", "TP_RAMP_EXP"]

#: Exponent of tp in the GEMM ramp (T0 x tp ** TP_RAMP_EXP); fitted, see module doc.
TP_RAMP_EXP = 0.25


@dataclass(frozen=True, slots=True)
class StepCost:
    duration: float  # seconds, everything included
    compute_s: float  # sum of the compute sides of the parts
    memory_s: float  # sum of the memory sides of the parts (elementwise included)


def elementwise_bytes_per_token(model: ModelProfile, tp: int = 1) -> float:
    """HBM bytes per token per layer of the non-GEMM ops (unfused, as Vidur profiles them).

    Two RMSNorms (read + write hidden), one residual add (2 reads + 1 write), RoPE on
    Q and K (read + write) and the activation (gated: read gate and up, write one).
    """
    act = (3 if model.gated_mlp else 2) * model.intermediate / tp
    rope = 2 * (model.heads + model.kv_heads_per_gpu(tp) * tp) * model.head_dim / tp
    return model.dtype_bytes * (7 * model.hidden + rope + act)


class Roofline:
    """Precomputed step-time coefficients of one replica: ``gpu`` x ``tp``, serving ``model``."""

    __slots__ = (
        "gpu", "model", "tp", "step_overhead_s",
        "_lin_c", "_lin_c0", "_lin_m", "_elt", "_fixed", "_attn_c", "_kv_m", "_head_c", "_head_m", "_ar", "_dl",
    )

    def __init__(self, gpu: GpuProfile, model: ModelProfile, tp: int = 1, step_overhead_s: float = 0.0) -> None:
        if tp < 1:
            raise ValueError("tp must be >= 1")
        self.gpu, self.model, self.tp, self.step_overhead_s = gpu, model, tp, step_overhead_s
        L = model.layers
        flops = gpu.bf16_tflops * 1e12 * gpu.mfu
        bw = gpu.hbm_tbps * 1e12
        lin = model.linear_params_per_layer / tp
        self._lin_c = L * 2 * lin / flops  # s per token
        self._lin_c0 = self._lin_c * gpu.gemm_ramp_tokens * tp**TP_RAMP_EXP
        self._lin_m = L * lin * model.dtype_bytes / (bw * gpu.bw_eff)
        self._elt = L * elementwise_bytes_per_token(model, tp) / (bw * gpu.elt_eff)  # s per token
        self._fixed = L * gpu.layer_floor_s + step_overhead_s
        self._attn_c = 4 * L * (model.heads / tp) * model.head_dim / flops  # s per (query, key) pair
        self._kv_m = model.kv_bytes_per_token_per_gpu(tp) / (bw * gpu.bw_eff)  # s per KV token touched
        self._head_c = 2 * model.lm_head_params / tp / flops  # s per sampled token
        self._head_m = model.lm_head_params * model.dtype_bytes / tp / (bw * gpu.bw_eff)
        if tp > 1:
            ring = 2 * (tp - 1) / tp * model.hidden * model.dtype_bytes / (gpu.interconnect_gbps * 1e9 * gpu.ar_eff)
            self._ar = (2 * L * gpu.ar_latency_s, 2 * L * ring)
        else:
            self._ar = (0.0, 0.0)
        self._dl: dict[int, tuple] = {}  # decode_line's per-batch-size constants

    def cost(
        self, tokens: int, prefill_pairs: float, prefill_kv: int, decode_kv: int, sampled: int
    ) -> tuple[float, float, float]:
        """(duration, compute_s, memory_s) of a step.

        ``tokens``: tokens scheduled; ``prefill_pairs``: sum over prefill chunks of
        c x (s + c/2) (query-key pairs, c new tokens after s computed ones);
        ``prefill_kv``: sum of s + c over those chunks; ``decode_kv``: sum of the
        context lengths (computed tokens + 1) of decoding requests; ``sampled``:
        requests that produce a token this step.
        """
        if tokens <= 0:
            return 0.0, 0.0, 0.0
        lc = self._lin_c * tokens + self._lin_c0
        lm = self._lin_m
        pc = self._attn_c * prefill_pairs
        pm = self._kv_m * prefill_kv
        dc = self._attn_c * decode_kv
        dm = self._kv_m * decode_kv
        if sampled:
            hc = self._head_c * sampled
            hm = self._head_m
        else:
            hc = hm = 0.0
        elt = self._elt * tokens
        ar_lat, ar_tok = self._ar
        duration = (
            (lc if lc > lm else lm)
            + (pc if pc > pm else pm)
            + (dc if dc > dm else dm)
            + (hc if hc > hm else hm)
            + elt
            + self._fixed
            + ar_lat
            + ar_tok * tokens
        )
        return duration, lc + pc + dc + hc, lm + pm + dm + hm + elt

    def decode_line(self, batch: int, context_sum: int) -> tuple[float, float, float, float, float, float]:
        """A run of decode steps: (d0, slope, c0, c_slope, m0, m_slope) for ``batch`` requests whose
        contexts sum to ``context_sum`` at the first step.

        Step j lasts d0 + slope x j (compute side c0 + c_slope x j, memory side m0 +
        m_slope x j); d0, c0, m0 are exactly ``cost(batch, 0, 0, context_sum, batch)`` and
        the slopes the differences with the next step's, as two :meth:`cost` calls give.
        """
        co = self._dl.get(batch)
        if co is None:
            lc = self._lin_c * batch + self._lin_c0
            lm = self._lin_m
            hc = self._head_c * batch
            hm = self._head_m
            co = (lc if lc > lm else lm, hc if hc > hm else hm, self._elt * batch, self._fixed, self._ar[0],
                  self._ar[1] * batch, lc, hc, lm, hm)
            self._dl[batch] = co
        lin, head, elt, fixed, ar_lat, ar, lc, hc, lm, hm = co
        ac = self._attn_c
        km = self._kv_m
        dc = ac * context_sum
        dm = km * context_sum
        d0 = lin + (dc if dc > dm else dm) + head + elt + fixed + ar_lat + ar
        c0 = lc + dc + hc
        m0 = lm + dm + hm + elt
        ctx = context_sum + batch
        dc = ac * ctx
        dm = km * ctx
        d1 = lin + (dc if dc > dm else dm) + head + elt + fixed + ar_lat + ar
        return d0, d1 - d0, c0, lc + dc + hc - c0, m0, lm + dm + hm + elt - m0

    def coefficients(self) -> dict[str, float]:
        """The precomputed constants by name (``lin_c``, ``lin_c0``, ..., ``ar_lat``, ``ar_tok``),
        for callers that vectorise :meth:`cost` over many replicas."""
        out = {k: getattr(self, "_" + k) for k in ("lin_c", "lin_c0", "lin_m", "elt", "fixed", "attn_c", "kv_m", "head_c", "head_m")}
        out["ar_lat"], out["ar_tok"] = self._ar
        return out

    def decode_step(self, batch: int, context_sum: int) -> float:
        """Duration of a step of ``batch`` decoding requests whose contexts sum to ``context_sum``."""
        return self.cost(batch, 0.0, 0, context_sum, batch)[0]


def predict_step(
    gpu: GpuProfile,
    model: ModelProfile,
    batch: Iterable[tuple[int, int, bool]],
    tp: int = 1,
    step_overhead_s: float = 0.002,
) -> StepCost:
    """Predict the step time of a hypothetical batch.

    ``batch`` holds one ``(new_tokens, computed_before, samples)`` per request: a
    decode is ``(1, context - 1, True)``; a prefill chunk of c tokens after s cached
    or computed ones is ``(c, s, last_chunk)``.
    """
    tokens = sampled = prefill_kv = decode_kv = 0
    pairs = 0.0
    for new, done, samples in batch:
        tokens += new
        sampled += 1 if samples else 0
        if new == 1 and samples:
            decode_kv += done + 1
        else:
            pairs += new * (done + new / 2)
            prefill_kv += done + new
    d, c, m = Roofline(gpu, model, tp, step_overhead_s).cost(tokens, pairs, prefill_kv, decode_kv, sampled)
    return StepCost(d, c, m)


def linear_layer_time(gpu: GpuProfile, model: ModelProfile, tokens: int, tp: int = 1) -> float:
    """Predicted time (s) of the non-attention part of ONE layer for ``tokens`` tokens.

    That is Vidur's ``mlp.csv`` operators of a layer: QKV and O projections, gated
    MLP up/down and activation, the two norms, RoPE and the residual add (no all-reduce).
    """
    flops = gpu.bf16_tflops * 1e12 * gpu.mfu
    bw = gpu.hbm_tbps * 1e12
    lin = model.linear_params_per_layer / tp
    compute = 2 * lin * (tokens + gpu.gemm_ramp_tokens * tp**TP_RAMP_EXP) / flops
    memory = lin * model.dtype_bytes / (bw * gpu.bw_eff)
    elementwise = tokens * elementwise_bytes_per_token(model, tp) / (bw * gpu.elt_eff)
    return max(compute, memory) + elementwise + gpu.layer_floor_s
