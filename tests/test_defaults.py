"""Pins every default: changing one must be a deliberate edit here, with its source updated."""

from steersman.config import DEFAULTS, sources

PINNED = {
    "engine.block_size": 16,
    "engine.gpu_memory_utilization": 0.9,
    "engine.max_num_batched_tokens": None,
    "engine.max_num_seqs": None,
    "engine.enable_prefix_caching": True,
    "engine.enable_chunked_prefill": True,
    "engine.scheduling_policy": "fcfs",
    "engine.tensor_parallel": 1,
    "engine.max_model_len": None,
    "engine.step_overhead_s": 0.002,
    "engine.weight_load_gbps": 2.0,
    "gateway.host": "127.0.0.1",
    "gateway.port": 8080,
    "gateway.max_body_bytes": 10 * 1024 * 1024,
    "gateway.max_tokens_limit": 131072,
    "gateway.metrics_interval_s": 0.05,
    "gateway.metrics_timeout_s": 1.0,
    "gateway.connect_timeout_s": 2.0,
    "gateway.upstream_idle_timeout_s": 4.0,
    "gateway.client_idle_timeout_s": 75.0,
    "gateway.unhealthy_after_failures": 3,
    "gateway.max_sse_event_bytes": 1024 * 1024,
    "sim_server.host": "127.0.0.1",
    "sim_server.port": 8000,
    "sim_server.speedup": 1.0,
    "sim_server.mean_output_tokens": 211.0,
    "sim_server.gpu": "H100-SXM",
    "sim_server.model": "llama-3.1-8b",
    "scheduler.profile": "steersman",
    "scheduler.default_slo": "standard",
    "scheduler.latency_ewma_alpha": 0.2,
    "scheduler.recent_load_tau_s": 60.0,
    "scheduler.prefix_index_max_mib": 128.0,
    "scheduler.saturation_queue_depth": 5,
    "scheduler.saturation_kv_usage": 0.8,
    "scheduler.saturation_staleness_s": 0.2,
    "scheduler.initial_output_estimate": 211,
    "admission.queue_max_entries": 1024,
    "admission.rate_burst_s": 60.0,
    "admission.open_tenant": "default",
    "admission.default_priority": "standard",
    "admission.workflow_max_entries": 100_000,
    "admission.workflow_idle_ttl_s": 3600.0,
    "admission.workflow_id_max_chars": 256,
    "llamacpp.version": "0.3.36",
    "llamacpp.model_name": "gemma-3-270m",
    "llamacpp.gguf_file": "gemma-3-270m-q4_k_m.gguf",
    "llamacpp.chat_template": "gemma",
    "llamacpp.parallel": 4,
    "llamacpp.ctx_size": 8192,
    "llamacpp.threads": 1,
    "llamacpp.cache_reuse": 256,
    "llamacpp.start_timeout_s": 120.0,
    "llamacpp.stop_grace_s": 5.0,
}

SLO = {"interactive": (0.45, 0.040), "standard": (2.0, 0.200), "batch": (None, None)}


def test_every_default_is_pinned_and_sourced():
    table = sources(DEFAULTS)
    slo = table.pop("scheduler.slo_classes")[0]
    assert {k: (c.ttft_s, c.tpot_s) for k, c in slo.items()} == SLO
    assert {k: v for k, (v, _) in table.items()} == PINNED
    missing = [k for k, (_, src) in table.items() if len(src) < 10]
    assert not missing, f"defaults without a source: {missing}"
