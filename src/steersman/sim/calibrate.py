"""Fit the roofline efficiencies of a GPU to Vidur's measured operator timings.

Vidur (Agrawal et al., MLSys 2024; MIT license) profiles every non-attention
operator of a transformer layer against ``num_tokens`` and the tensor-parallel
degree: ``compute/<gpu>/<model>/mlp.csv``, ``time_stats.<op>.median`` in ms.

The fit is two least-squares problems on relative error (every row weighs the same
whatever its size):

* the four GEMMs (attn_pre_proj, attn_post_proj, mlp_up_proj, mlp_down_proj) give
  ``mfu``, ``bw_eff``, ``gemm_ramp_tokens`` and a GEMM kernel floor;
* the elementwise ops (two norms, attn_rope, mlp_act, add) give ``elt_eff`` and an
  elementwise floor; the two floors add up to ``layer_floor_s``.

Run ``python -m steersman.sim.calibrate`` to print the fitted constants and the
errors; the constants stored in :mod:`steersman.sim.gpus` came from that run.
Not used at run time (imports numpy).
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from steersman.sim.gpus import GpuProfile, gpu_profile
from steersman.sim.models import ModelProfile, model_profile
from steersman.sim.roofline import TP_RAMP_EXP, elementwise_bytes_per_token, linear_layer_time

__all__ = ["VidurRow", "load_vidur", "fit", "errors", "vidur_csv", "GEMM_OPS", "ELEMENTWISE_OPS"]

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")


@dataclass(frozen=True, slots=True)
class VidurRow:
    tokens: int
    tp: int
    gemm_s: float
    elementwise_s: float

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.elementwise_s


def vidur_csv(shared: Path, gpu: str, model: str = "meta-llama/Llama-2-7b-hf") -> Path:
    return shared / "profiles" / "vidur" / "compute" / gpu / model / "mlp.csv"


def load_vidur(path: Path) -> list[VidurRow]:
    """Per-layer GEMM and elementwise times (seconds, medians) of every row of an mlp.csv."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            def ms(op: str) -> float:
                return float(r[f"time_stats.{op}.median"]) * 1e-3

            rows.append(
                VidurRow(
                    int(r["num_tokens"]),
                    int(r["num_tensor_parallel_workers"]),
                    sum(ms(op) for op in GEMM_OPS),
                    sum(ms(op) for op in ELEMENTWISE_OPS),
                )
            )
    return rows


def _nelder_mead(f: Callable[[list[float]], float], x0: Sequence[float], iters: int = 3000) -> list[float]:
    import numpy as np

    simplex = [np.array(x0, float)]
    for i in range(len(x0)):
        y = np.array(x0, float)
        y[i] = y[i] * 1.25 if y[i] else 1e-6
        simplex.append(y)
    vals = [f(list(s)) for s in simplex]
    for _ in range(iters):
        order = np.argsort(vals)
        simplex = [simplex[i] for i in order]
        vals = [vals[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(list(xr))
        if fr < vals[0]:
            xe = centroid + 2 * (centroid - simplex[-1])
            fe = f(list(xe))
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(list(xc))
            if fc < vals[-1]:
                simplex[-1], vals[-1] = xc, fc
            else:
                simplex = [simplex[0] + 0.5 * (s - simplex[0]) for s in simplex]
                vals = [f(list(s)) for s in simplex]
    return list(simplex[int(np.argmin(vals))])


def fit(gpu: GpuProfile, model: ModelProfile, rows: Sequence[VidurRow]) -> GpuProfile:
    """``gpu`` with mfu, bw_eff, gemm_ramp_tokens, elt_eff and layer_floor_s fitted to ``rows``."""
    peak = gpu.bf16_tflops * 1e12
    bw = gpu.hbm_tbps * 1e12

    import numpy as np

    tokens = np.array([r.tokens for r in rows], float)
    tp = np.array([r.tp for r in rows], float)
    gemm_s = np.array([r.gemm_s for r in rows])
    elt_s = np.array([r.elementwise_s for r in rows])
    lin = model.linear_params_per_layer / tp
    elt_bytes = np.array([elementwise_bytes_per_token(model, r.tp) for r in rows])

    def gemm_loss(x: list[float]) -> float:
        mfu, bw_eff, ramp, floor_us = x
        if min(x) <= 0:
            return 1e9
        compute = 2 * lin * (tokens + ramp * tp**TP_RAMP_EXP) / (peak * mfu)
        pred = np.maximum(compute, lin * model.dtype_bytes / (bw * bw_eff)) + floor_us * 1e-6
        return float(np.mean((pred / gemm_s - 1) ** 2))

    def elt_loss(x: list[float]) -> float:
        elt_eff, floor_us = x
        if min(x) <= 0:
            return 1e9
        pred = tokens * elt_bytes / (bw * elt_eff) + floor_us * 1e-6
        return float(np.mean((pred / elt_s - 1) ** 2))

    g = _nelder_mead(gemm_loss, _nelder_mead(gemm_loss, [0.7, 0.8, 100.0, 10.0]))
    e = _nelder_mead(elt_loss, _nelder_mead(elt_loss, [0.5, 10.0]))
    return dataclasses.replace(
        gpu,
        mfu=round(float(g[0]), 3),
        bw_eff=round(float(g[1]), 3),
        gemm_ramp_tokens=round(float(g[2]), 1),
        elt_eff=round(float(e[0]), 3),
        layer_floor_s=round(float(g[3] + e[1]) * 1e-6, 7),
    )


def errors(gpu: GpuProfile, model: ModelProfile, rows: Sequence[VidurRow]) -> list[float]:
    """Absolute relative error of :func:`linear_layer_time` for each row."""
    return [abs(linear_layer_time(gpu, model, r.tokens, r.tp) / r.total_s - 1) for r in rows]


def main() -> None:  # pragma: no cover - a tool, run by hand
    shared = Path(__file__).resolve().parents[4] / "shared"
    model = model_profile("Llama-2-7B")
    for vidur_name, name in (("h100", "H100"), ("a100", "A100")):
        rows = load_vidur(vidur_csv(shared, vidur_name))
        fitted = fit(gpu_profile(name), model, rows)
        print(fitted)
        for tps in ((1,), (2,), (4,), (8,), (1, 2, 4, 8)):
            err = errors(fitted, model, [r for r in rows if r.tp in tps])
            print(f"  tp {tps}: mean {100 * sum(err) / len(err):.2f}%  max {100 * max(err):.2f}%  n={len(err)}")


if __name__ == "__main__":  # pragma: no cover
    main()
