"""GPU profiles: datasheet numbers, a list price, and calibrated roofline efficiencies.

Datasheet sources (dense BF16 tensor throughput, i.e. *without* 2:4 sparsity):

* A100-80GB SXM: NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TFLOPS BF16,
  80 GB HBM2e, 2,039 GB/s, NVLink 3 600 GB/s (300 GB/s per direction).
* H100-SXM: NVIDIA H100 Tensor Core GPU datasheet (2023): 989 TFLOPS BF16
  (1,979 with sparsity), 80 GB HBM3, 3.35 TB/s, NVLink 4 900 GB/s (450 per direction).
* H200 (SXM): NVIDIA H200 datasheet (2024): 989 TFLOPS BF16, 141 GB HBM3e,
  4.8 TB/s, NVLink 900 GB/s.
* B200 (HGX B200): NVIDIA HGX B200 / DGX B200 datasheets (2025): 18 PFLOPS dense
  FP16/BF16 per 8 GPUs = 2.25 PFLOPS per GPU, 1,440 GB HBM3e per 8 GPUs = 180 GB,
  64 TB/s per 8 GPUs = 8 TB/s, NVLink 5 1.8 TB/s (900 per direction).
* L40S: NVIDIA L40S datasheet (2023): 362.05 TFLOPS BF16 (733 with sparsity),
  48 GB GDDR6, 864 GB/s, no NVLink: PCIe Gen4 x16 64 GB/s bidirectional (32 per direction).
* MI300X: AMD Instinct MI300X datasheet (2023): 1,307.4 TFLOPS BF16 dense,
  192 GB HBM3, 5.3 TB/s, 7 Infinity Fabric links, 896 GB/s aggregate
  bidirectional (448 per direction; a 2-GPU TP group only uses one 64 GB/s link,
  which this single number does not model).

``hbm_gb`` is the datasheet capacity.  HBM capacities are binary in practice (an
"80GB" H100 reports 81,559 MiB to the driver), so :attr:`GpuProfile.hbm_bytes`
uses GiB, which is what vLLM's ``gpu_memory_utilization`` multiplies.

Prices (``price_per_hour``, $ per GPU-hour, on-demand): RunPod on-demand GPU pod
prices (runpod.io/pricing, snapshot of March 2026 as tabulated by
deploybase.ai "RunPod GPU Pricing: 2026"): A100 SXM $1.39, H100 SXM $2.69,
H200 $3.59, B200 $5.98, L40S $0.79.  RunPod lists no MI300X; its price is
Vultr's on-demand MI300X rate, $1.85 (gpu.blog marketplace listing, 2025).
These move quickly: treat them as defaults a caller overrides.

Roofline efficiencies (see :mod:`steersman.sim.roofline` for the formula):
``mfu``, ``bw_eff``, ``gemm_ramp_tokens``, ``elt_eff`` and ``layer_floor_s`` of
H100 and A100 were fitted by least squares (relative error) on Vidur's measured
per-operator timings of Llama-2-7B (``shared/profiles/vidur/compute/{h100,a100}/
meta-llama/Llama-2-7b-hf/mlp.csv``, all 1,044 rows, TP 1/2/4/8) with
:func:`steersman.sim.calibrate.fit` (``python -m steersman.sim.calibrate``).
``ar_latency_s``/``ar_eff`` come from a latency + bandwidth least-squares fit of
Vidur's NCCL ``network/{h100,a100}_dgx/all_reduce.csv`` (8 GPUs).  GPUs without
profiles use typical values: MFU 0.70-0.75 of dense peak for large BF16 GEMMs
(0.5 on MI300X, whose achieved hipBLASLt BF16 GEMM throughput is about half of
peak in public measurements; 0.80 of its HBM bandwidth), ``bw_eff`` 0.84 (mean of
the two fitted GPUs, 0.80 and 0.88), ``elt_eff`` 0.55 (fitted: 0.53 and 0.57), a GEMM ramp of 0.55 x the ridge point
(peak FLOPs / HBM bandwidth; the fitted H100 and A100 ramps are 0.57 and 0.54 of
theirs) and a 30 us per-layer kernel floor (fitted: 29 and 31 us; 40 us on MI300X,
whose kernel launch latencies are longer).  The ramp exponent in tp
(:data:`steersman.sim.roofline.TP_RAMP_EXP`) is shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["GpuProfile", "GPUS", "gpu_profile"]

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str
    bf16_tflops: float  # dense BF16 tensor-core peak, TFLOP/s
    hbm_gb: float  # datasheet memory capacity (GiB in practice, see module doc)
    hbm_tbps: float  # datasheet memory bandwidth, TB/s
    price_per_hour: float  # $ per GPU-hour, on-demand list price
    interconnect_gbps: float  # GPU-GPU bandwidth per direction used by TP all-reduce, GB/s
    mfu: float = 0.75  # achieved fraction of peak FLOP/s for large GEMMs / attention
    bw_eff: float = 0.84  # achieved fraction of HBM bandwidth streaming weights / KV
    gemm_ramp_tokens: float = 150.0  # T0: GEMM time ~ FLOPs x (T + T0) / T (tile/wave quantisation)
    elt_eff: float = 0.55  # achieved fraction of HBM bandwidth for elementwise ops (norm, act, rope, add)
    layer_floor_s: float = 30e-6  # fixed kernel time per layer (launch/tail latencies of ~9 kernels)
    ar_latency_s: float = 30e-6  # latency of one small all-reduce
    ar_eff: float = 0.75  # achieved fraction of interconnect bandwidth for large all-reduces

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * GIB

    @property
    def ridge_flops_per_byte(self) -> float:
        return self.bf16_tflops / self.hbm_tbps


def _typical_ramp(tflops: float, tbps: float) -> float:
    return round(0.55 * tflops / tbps, 1)


_PROFILES = (
    # Fitted on Vidur a100 Llama-2-7B mlp.csv: mean |err| 5.0% (max 23.7%) of the
    # per-layer non-attention time over all 1,044 rows; NCCL fit on a100_dgx (8 GPUs).
    GpuProfile(
        "A100-80GB", 312.0, 80, 2.039, 1.39, 300.0,
        mfu=0.763, bw_eff=0.799, gemm_ramp_tokens=81.2, elt_eff=0.534, layer_floor_s=30.6e-6,
        ar_latency_s=44.7e-6, ar_eff=0.45,
    ),
    # Fitted on Vidur h100 Llama-2-7B mlp.csv: mean |err| 4.5% (max 23.6%) over all
    # 1,044 rows; NCCL fit on h100_dgx (8 GPUs).
    GpuProfile(
        "H100-SXM", 989.0, 80, 3.35, 2.69, 450.0,
        mfu=0.765, bw_eff=0.883, gemm_ramp_tokens=169.5, elt_eff=0.571, layer_floor_s=29.3e-6,
        ar_latency_s=28.5e-6, ar_eff=0.75,
    ),
    # Same silicon as H100 with faster, larger HBM3e: H100's fitted compute
    # efficiencies, typical memory-side values.
    GpuProfile(
        "H200", 989.0, 141, 4.8, 3.59, 450.0,
        mfu=0.765, gemm_ramp_tokens=_typical_ramp(989.0, 4.8), layer_floor_s=29.3e-6,
        ar_latency_s=28.5e-6, ar_eff=0.75,
    ),
    GpuProfile(
        "B200", 2250.0, 180, 8.0, 5.98, 900.0,
        mfu=0.70, gemm_ramp_tokens=_typical_ramp(2250.0, 8.0),
        ar_latency_s=28.5e-6, ar_eff=0.75,
    ),
    GpuProfile(
        "L40S", 362.05, 48, 0.864, 0.79, 32.0,
        mfu=0.70, gemm_ramp_tokens=_typical_ramp(362.05, 0.864),
        ar_latency_s=40e-6, ar_eff=0.70,
    ),
    GpuProfile(
        "MI300X", 1307.4, 192, 5.3, 1.85, 448.0,
        mfu=0.50, bw_eff=0.80, gemm_ramp_tokens=_typical_ramp(1307.4, 5.3), layer_floor_s=40e-6,
        ar_latency_s=35e-6, ar_eff=0.60,
    ),
)

#: Known GPUs by canonical name.
GPUS: Mapping[str, GpuProfile] = MappingProxyType({g.name: g for g in _PROFILES})

_ALIASES = {
    "a100": "A100-80GB", "a100-80gb": "A100-80GB", "a100-sxm": "A100-80GB", "a100-80gb-sxm": "A100-80GB",
    "a100-sxm4-80gb": "A100-80GB", "a100 80gb": "A100-80GB",
    "h100": "H100-SXM", "h100-sxm": "H100-SXM", "h100-sxm5": "H100-SXM", "h100-80gb": "H100-SXM",
    "h100 sxm": "H100-SXM", "h100-sxm-80gb": "H100-SXM",
    "h200": "H200", "h200-sxm": "H200", "h200-141gb": "H200",
    "b200": "B200", "hgx-b200": "B200",
    "l40s": "L40S", "l40s-48gb": "L40S",
    "mi300x": "MI300X", "mi300": "MI300X", "amd-mi300x": "MI300X", "instinct-mi300x": "MI300X",
}


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").removeprefix("nvidia-").removeprefix("nvidia ")


def gpu_profile(name: str) -> GpuProfile:
    """The profile of GPU ``name`` (case-insensitive; aliases like "H100", "a100-80gb")."""
    key = _key(name)
    canonical = _ALIASES.get(key) or next((n for n in GPUS if n.lower() == key), None)
    if canonical is None:
        raise KeyError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return GPUS[canonical]
