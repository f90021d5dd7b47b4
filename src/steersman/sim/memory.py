"""How a replica's GPU memory is split, and vLLM's per-GPU batch defaults.

vLLM v1 (``vllm/v1/worker/gpu_worker.py`` determine_available_memory, and
``vllm/v1/core/kv_cache_utils.py``) gives the KV cache what is left of
``gpu_memory_utilization x total memory`` after the weights, the peak activation
memory of a profiling forward pass of ``max_num_batched_tokens`` tokens, and
non-torch allocations (NCCL, CUDA graphs, allocator slack).  The number of blocks is
that divided by the size of one block on one GPU (block_size x per-GPU KV bytes per
token), identical on every GPU of a tensor-parallel group.

The activation peak is estimated, not profiled: the widest intermediate tensors of
one layer for ``max_num_batched_tokens`` tokens (residual stream, QKV, gate+up
projection output) plus the FP32 logits of ``max_num_seqs`` sampled sequences.
For Llama-3.1-8B on an H100 at 0.9 this leaves 55.3 GiB, 453k tokens of KV,
close to the ~54-55 GiB vLLM logs for that setup.
"""

from __future__ import annotations

from steersman.config import EngineSettings
from steersman.sim.gpus import GIB, GpuProfile
from steersman.sim.models import ModelProfile

__all__ = ["batch_limits", "activation_reserve_bytes", "kv_cache_bytes_per_gpu", "num_kv_blocks", "replica_capacity",
           "check_tensor_parallel", "NON_TORCH_BYTES"]

#: Non-torch memory per GPU (CUDA context extras, NCCL buffers, CUDA graph pools).
NON_TORCH_BYTES = 0.75 * GIB


def batch_limits(gpu: GpuProfile, settings: EngineSettings) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs), applying vLLM's per-GPU defaults for None.

    vLLM EngineArgs.get_batch_defaults (OpenAI server): 8192 / 1024 on GPUs with at
    least 70 GiB that are not A100s, else 2048 / 256.
    """
    big = gpu.hbm_bytes >= 70 * GIB and "a100" not in gpu.name.lower()
    tokens = settings.max_num_batched_tokens if settings.max_num_batched_tokens is not None else (8192 if big else 2048)
    seqs = settings.max_num_seqs if settings.max_num_seqs is not None else (1024 if big else 256)
    if tokens < 1 or seqs < 1:
        raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
    return tokens, seqs


def activation_reserve_bytes(model: ModelProfile, tp: int, max_tokens: int, max_seqs: int) -> float:
    per_token = model.dtype_bytes * (
        2 * model.hidden + (model.q_dim + 2 * model.kv_dim) / tp + 2 * model.intermediate / tp
    )
    logits = 4 * min(max_seqs, max_tokens) * model.vocab / tp
    return max_tokens * per_token + logits


def kv_cache_bytes_per_gpu(
    gpu: GpuProfile, model: ModelProfile, settings: EngineSettings, max_tokens: int, max_seqs: int
) -> float:
    tp = settings.tensor_parallel
    budget = gpu.hbm_bytes * settings.gpu_memory_utilization
    return (
        budget
        - model.weight_bytes_per_gpu(tp)
        - activation_reserve_bytes(model, tp, max_tokens, max_seqs)
        - NON_TORCH_BYTES
    )


def num_kv_blocks(
    gpu: GpuProfile, model: ModelProfile, settings: EngineSettings, max_tokens: int, max_seqs: int
) -> int:
    """KV blocks of the replica; raises ValueError if the weights leave no room for KV."""
    free = kv_cache_bytes_per_gpu(gpu, model, settings, max_tokens, max_seqs)
    if free <= 0:
        need = (gpu.hbm_bytes * settings.gpu_memory_utilization - free) / GIB
        raise ValueError(
            f"{model.name} does not fit on {settings.tensor_parallel} x {gpu.name}: weights and activations need "
            f"{need:.1f} GiB per GPU, {settings.gpu_memory_utilization:.0%} of HBM is "
            f"{gpu.hbm_bytes * settings.gpu_memory_utilization / GIB:.1f} GiB; raise tensor_parallel"
        )
    block_bytes = settings.block_size * model.kv_bytes_per_token_per_gpu(settings.tensor_parallel)
    return int(free // block_bytes)


def check_tensor_parallel(model: ModelProfile, tp: int) -> None:
    """ValueError unless ``model`` can be split over ``tp`` GPUs as vLLM splits it: the attention heads evenly
    (``ModelConfig.verify_with_parallel_config``), and the KV heads evenly, or replicated a whole number of times
    when there are fewer than GPUs (``QKVParallelLinear``)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor_parallel must be an integer >= 1, got {tp!r}")
    if model.heads % tp:
        raise ValueError(f"{model.name}'s {model.heads} attention heads must be divisible by tensor_parallel ({tp}), "
                         f"as vLLM requires")
    kv = model.kv_heads
    if (kv % tp) if tp <= kv else (tp % kv):
        raise ValueError(f"{model.name}'s {kv} KV heads cannot be split over tensor_parallel {tp} GPUs (vLLM splits "
                         f"them evenly, or replicates them when there are fewer KV heads than GPUs)")


def replica_capacity(gpu: GpuProfile, model: ModelProfile, settings: EngineSettings,
                     kv_blocks: int | None = None) -> tuple[int, int, int, int]:
    """(max_num_batched_tokens, max_num_seqs, max_model_len, KV blocks) of ``settings.tensor_parallel`` x ``gpu``
    serving ``model``; ValueError, saying what to change, if vLLM would refuse to start it that way.
    ``kv_blocks`` overrides the capacity computed from memory (tests, what-ifs)."""
    if settings.scheduling_policy not in ("fcfs", "priority"):
        raise ValueError(f"unknown scheduling_policy {settings.scheduling_policy!r}")
    check_tensor_parallel(model, settings.tensor_parallel)
    tokens, seqs = batch_limits(gpu, settings)
    max_len = settings.max_model_len or model.max_context
    if max_len > model.max_context:
        raise ValueError(f"max_model_len {max_len} > {model.name}'s {model.max_context} positions")
    blocks = kv_blocks
    if blocks is None:
        blocks = num_kv_blocks(gpu, model, settings, tokens, seqs)
    elif blocks < 1:
        raise ValueError("kv_blocks must be >= 1")
    if blocks * settings.block_size < max_len:
        raise ValueError(
            f"max_model_len {max_len} is larger than the KV cache ({blocks * settings.block_size} "
            f"tokens) of {settings.tensor_parallel} x {gpu.name} for {model.name}; lower max_model_len"
        )
    return tokens, seqs, max_len, blocks
