from hypothesis import given, strategies as st

from steersman.engines.promtext import read_labelled, read_samples

PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_running_extra{engine="0"} 99.0
vllm:num_requests_waiting 7
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25 1700000000
vllm:prefix_cache_hits_total{engine="0",model_name="m"} NaN
steersman_sim:weights_state{engine="0",model_name="m",state="cold"} 0.0
steersman_sim:weights_state{engine="0",model_name="m",state="warm"} 1.0
"""

NAMES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv",
    "vllm:prefix_cache_hits_total": "hits",
    "vllm:absent": "absent",
}


def test_reads_and_sums_exact_names_only():
    v = read_samples(PAGE, NAMES)
    assert v == {"running": 5.0, "waiting": 7.0, "kv": 0.25}
    assert read_labelled(PAGE, "steersman_sim:weights_state", "state") == {"cold": 0.0, "warm": 1.0}


def test_first_line_and_no_trailing_newline():
    assert read_samples("vllm:num_requests_waiting 4", NAMES) == {"waiting": 4.0}


@given(st.text())
def test_never_raises_on_garbage(text):
    read_samples(text, NAMES)
    read_labelled(text, "vllm:num_requests_running", "engine")
