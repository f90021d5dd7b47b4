"""Settings of the engine model (one serving replica), mirroring vLLM v1's knobs."""

from __future__ import annotations

from dataclasses import dataclass

from steersman.config._base import check_bounds, setting

__all__ = ["EngineSettings"]


@dataclass(frozen=True, slots=True)
class EngineSettings:
    block_size: int = setting(16, "vLLM CacheConfig.block_size default on CUDA (16 tokens per KV block)", ge=1)
    message_token_cache_mib: float = setting(
        64.0, "design: each process (gateway, engine-sim) keeps the token ids of recently seen chat messages "
        "(a shared system prompt, a conversation's earlier turns) so only new messages are tokenized; "
        "~20 bytes per token with its text, so 64 MiB holds ~3M tokens; least recently used dropped first"
    )
    gpu_memory_utilization: float = setting(0.9, "vLLM CacheConfig.gpu_memory_utilization default 0.9", gt=0, le=1)
    max_num_batched_tokens: int | None = setting(
        None,
        "vLLM EngineArgs.get_batch_defaults for the OpenAI server: 8192 on GPUs with >=70 GiB that are not A100, "
        "else 2048 (None = apply that rule to the replica's GPU)", ge=1,
    )
    max_num_seqs: int | None = setting(
        None, "vLLM EngineArgs.get_batch_defaults for the OpenAI server: 1024 on >=70 GiB non-A100 GPUs, else 256", ge=1
    )
    enable_prefix_caching: bool = setting(True, "vLLM v1 enables prefix caching by default")
    enable_chunked_prefill: bool = setting(True, "vLLM v1 always uses chunked prefill")
    scheduling_policy: str = setting("fcfs", "vLLM SchedulerConfig.policy default 'fcfs' ('priority' optional)")
    tensor_parallel: int = setting(1, "vLLM ParallelConfig.tensor_parallel_size default 1", ge=1)
    max_model_len: int | None = setting(None, "vLLM uses the model's max_position_embeddings (None = model profile)", ge=1)
    step_overhead_s: float = setting(
        0.002,
        "per-step CPU overhead (scheduling, sampling, detokenisation) of vLLM v1 with CUDA graphs: "
        "~1.5-3 ms measured in the vLLM v1 blog (2025-01); 2 ms",
    )
    weight_load_gbps: float = setting(
        2.0, "weights load bandwidth in GB/s from local NVMe into HBM (safetensors, typical 1.5-3 GB/s)", gt=0
    )
    kv_link_gbit_s: float = setting(
        400.0,
        "KV transfer link per GPU in Gbit/s between prefill and decode replicas (disaggregated serving): one "
        "ConnectX-7 NDR InfiniBand NIC per GPU, 400 Gb/s, as in NVIDIA DGX H100 (RDMA via NIXL in vLLM / Dynamo)", gt=0,
    )

    def __post_init__(self) -> None:
        check_bounds(self)
