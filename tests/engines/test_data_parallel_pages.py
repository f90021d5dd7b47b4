"""One /metrics page speaking for several engines (vLLM data parallel ``engine=``, SGLang ``dp_rank=``): counts add
up, the KV capacity adds up, the KV usage is the engines' mean weighted by capacity (never their sum)."""

import pytest

from steersman.engines.metric_names import METRIC_NAMES
from steersman.engines.openai_http import parse_metrics
from steersman.engines.promtext import label_value


def _vllm(*engines: tuple[float, float, int]) -> str:
    """One line per engine and family: (running, usage, num_gpu_blocks of 16 tokens)."""
    fams: dict[str, list[str]] = {}
    for e, (running, usage, blocks) in enumerate(engines):
        lab = f'engine="{e}",model_name="m"'
        fams.setdefault("run", []).append(f"vllm:num_requests_running{{{lab}}} {running}")
        fams.setdefault("kv", []).append(f"vllm:kv_cache_usage_perc{{{lab}}} {usage}")
        fams.setdefault("q", []).append(f"vllm:prefix_cache_queries_total{{{lab}}} {100 * (e + 1)}.0")
        fams.setdefault("h", []).append(f"vllm:prefix_cache_hits_total{{{lab}}} {10 * (e + 1)}.0")
        fams.setdefault("info", []).append(
            f'vllm:cache_config_info{{block_size="16",engine="{e}",num_gpu_blocks="{blocks}"}} 1.0')
    return "\n".join(line for lines in fams.values() for line in lines) + "\n"


def test_two_vllm_engines_half_full_are_half_full_with_twice_the_capacity():
    m = parse_metrics(_vllm((3, 0.45, 1000), (4, 0.45, 1000)), METRIC_NAMES["vllm"], block_size=16)
    assert m.kv_usage == pytest.approx(0.45)  # was 0.90: summed
    assert m.kv_blocks_total == 2000.0  # was 1000: the first engine's
    assert (m.num_running, m.prefix_queries, m.prefix_hits) == (7.0, 300.0, 30.0)


def test_usage_is_weighted_by_each_engines_capacity():
    m = parse_metrics(_vllm((0, 0.2, 1000), (0, 0.6, 3000)), METRIC_NAMES["vllm"], block_size=16)
    assert m.kv_usage == pytest.approx((0.2 * 1000 + 0.6 * 3000) / 4000)
    assert m.kv_blocks_total == 4000.0


def test_usage_without_capacity_is_the_plain_mean():
    page = 'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.6\n'
    m = parse_metrics(page, METRIC_NAMES["openai"])
    assert m.kv_usage == pytest.approx(0.4) and m.kv_blocks_total is None


def test_sglang_dp_ranks_average_usage_and_add_capacity():
    page = "".join(
        f'sglang:num_running_reqs{{dp_rank="{r}",model_name="m",pp_rank="0",tp_rank="0"}} {n}\n'
        for r, n in ((0, 2), (1, 3))) + "".join(
        f'sglang:token_usage{{dp_rank="{r}",model_name="m",pp_rank="0",tp_rank="0"}} {u}\n'
        for r, u in ((0, 0.25), (1, 0.75))) + "".join(
        f'sglang:max_total_num_tokens{{dp_rank="{r}",model_name="m",pp_rank="0",tp_rank="0"}} 16384.0\n'
        for r in (0, 1))
    m = parse_metrics(page, METRIC_NAMES["sglang"], block_size=16)
    assert m.num_running == 5.0
    assert m.kv_usage == pytest.approx(0.5)
    assert m.kv_blocks_total == 2 * 16384 / 16


def test_a_label_is_matched_by_its_whole_name():
    labels = 'engine="0",hash_block_size="None",block_size="128",num_gpu_blocks="100"'
    assert label_value(labels, "block_size") == "128"
    assert label_value(labels, "engine") == "0" and label_value(labels, "gine") is None
    page = f"vllm:cache_config_info{{{labels}}} 1.0\n"
    assert parse_metrics(page, METRIC_NAMES["vllm"], block_size=16).kv_blocks_total == 800.0
