"""Every engine kind's work counter (``EngineMetrics.progress``), read from its real page.

The stall rule counts a replica whose counter advanced between two scrapes as making progress, also when nothing
of ours streams there (tests/faults/test_busy_not_hung_live.py).  Which counter moves while a request runs differs
per engine (steersman.engines.metric_names): vLLM's token counters every step, llama.cpp's ``n_decode_total`` at
every ``llama_decode`` call (its ``tokens_predicted_total`` only when a request ends), SGLang's
``realtime_tokens_total`` every decode log interval."""

from pathlib import Path

from steersman.engines.llamacpp import llamacpp_metrics
from steersman.engines.metric_names import METRIC_NAMES
from steersman.engines.openai_http import metrics_path, parse_metrics

DATA = Path(__file__).parent / "data"


def test_vllm_counts_its_prompt_and_generated_tokens():
    m = parse_metrics((DATA / "vllm_metrics_recorded.txt").read_text(), METRIC_NAMES["vllm"], block_size=16)
    assert m.progress == 840.0 + 16.0  # vllm:prompt_tokens_total + vllm:generation_tokens_total (a real vLLM page)
    assert "name%5B%5D=vllm%3Ageneration_tokens_total" in metrics_path(METRIC_NAMES["vllm"])  # asked for by name


def test_llamacpp_counts_its_decode_calls_not_its_finished_tokens():
    # a real llama-server busy page: 2 requests processing, 8 llama_decode calls, 0 tokens predicted (none ended)
    m = llamacpp_metrics((DATA / "llamacpp_metrics_busy.txt").read_text(), None)
    assert m.progress == 8.0 and m.decode_tokens == 0.0


def test_sglang_sums_its_realtime_tokens_over_modes():
    page = (DATA / "sglang_metrics.txt").read_text()
    assert parse_metrics(page, METRIC_NAMES["sglang"]).progress == 5000.0  # generation_tokens_total alone
    lab = 'model_name="gemma-3-270m",engine_type="unified",tp_rank="0",pp_rank="0"'
    page += "".join(f'sglang:realtime_tokens_total{{{lab},mode="{mode}"}} {v}\n'
                    for mode, v in (("prefill_compute", 300.0), ("prefill_cache", 200.0), ("decode", 40.0)))
    assert parse_metrics(page, METRIC_NAMES["sglang"]).progress == 5000.0 + 540.0


def test_a_page_without_a_work_counter_says_nothing():
    assert parse_metrics("vllm:num_requests_running 1\n", METRIC_NAMES["vllm"]).progress is None


def test_the_old_vllm_names_are_still_read_with_the_counters_present():
    """The legacy read (vLLM <= 0.9.1's ``gpu_prefix_cache_*``) is asked for by field: several samples adding up
    to one field (the progress counter) do not make a current page look old, nor hide an old one."""
    old = ("vllm:gpu_prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hits_total 4\n"
           "vllm:generation_tokens_total 7\n")
    m = parse_metrics(old, METRIC_NAMES["vllm"])
    assert (m.prefix_queries, m.prefix_hits, m.progress) == (10.0, 4.0, 7.0)

