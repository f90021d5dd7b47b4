import pytest
from hypothesis import given, strategies as st
from prometheus_client.parser import text_string_to_metric_families

from steersman.engines.promtext import read_labelled, read_per_label, read_samples, read_total

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
    read_per_label(text, "vllm:num_requests_running", "engine")
    read_total(text, "vllm:num_requests_running", "engine")


N = "vllm:num_requests_running"


@pytest.mark.parametrize("page", [
    f'{N}{{engine="0"}} 3\n\n{N}{{engine="1"}} 4\n',  # a blank line inside the group
    f'{N}{{engine="0"}} 3\n# a comment\n{N}{{engine="1"}} 4\n',  # a comment inside the group
    f'{N}{{engine="0"}} 3\r\n\r\n{N}{{engine="1"}} 4\r\n',
    f'{N} {{engine="0"}} 3\n{N}\t{{engine="1"}} 4\n',  # blanks between the name and its labels
    f'  {N}{{engine="0"}} 3\n\t{N}{{engine="1"}} 4\n',  # an indented page
    f'{N}{{engine="0"}} 3\n {N}{{engine="1"}} 4\n',  # an indented line in the group
    f' # HELP {N} running\n # TYPE {N} gauge\n {N}{{engine="0"}} 3\n\n  # x\n {N} {{engine="1"}} 4\n# EOF\n',
])
def test_the_whole_group_is_read_in_any_form_the_format_allows(page):
    assert read_samples(page, {N: "x"}) == {"x": 7.0}
    assert read_labelled(page, N, "engine") == {"0": 3.0, "1": 4.0}


def test_the_group_still_ends_at_the_next_metric():
    page = f'{N}{{engine="0"}} 3\n# HELP other x\nother 1\n{N}_extra 5\n{N}{{engine="1"}} 4\n'
    assert read_samples(page, {N: "x", "other": "o"}) == {"x": 3.0, "o": 1.0}  # one group: the rest is not read
    assert read_samples(f"{N}_extra 5\n{N} 2\n", {N: "x"}) == {"x": 2.0}  # a prefix sibling before it: skipped


_LINE_ENDS = st.sampled_from(["\n", "\r\n"])


@st.composite
def _pages(draw):
    """prometheus_client-like pages: families of samples with blank and comment lines anywhere, blanks before
    the labels; some indented (every line starts with blanks)."""
    lines, want = [], {}
    lead = draw(st.sampled_from(["", "", " ", "\t "]))
    for fam in draw(st.lists(st.sampled_from([N, N + "_extra", "vllm:num", "other"]), unique=True, max_size=4)):
        lines.append(f"# HELP {fam} {draw(st.text('ab ' + N, max_size=8))}")
        lines.append(f"# TYPE {fam} gauge")
        for e in range(draw(st.integers(0, 3))):
            gap = draw(st.sampled_from(["", " ", "  "]))
            value = draw(st.integers(0, 99))
            lines.append(f'{fam}{gap}{{engine="{e}"}} {value}')
            want[fam] = want.get(fam, 0.0) + value
            lines += draw(st.lists(st.sampled_from(["", "# c", f"# {fam}"]), max_size=2))
    return draw(_LINE_ENDS).join(lead + line if line else line for line in lines) + "\n", want


@given(_pages())
def test_reads_what_prometheus_clients_parser_reads(case):
    page, want = case
    names = {f: f for f in (N, N + "_extra", "vllm:num", "other")}
    ref = {}
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            ref[s.name] = ref.get(s.name, 0.0) + s.value
    assert read_samples(page, names) == ref == want


def test_one_figure_per_label_value_however_many_series_repeat_it():
    page = "".join(f'{N}{{dp_rank="{d}",tp_rank="{t}"}} {v}\n' for d, t, v in (
        ("0", "0", 4), ("0", "1", 4), ("1", "0", 3), ("1", "1", 3)))
    assert read_per_label(page, N, "dp_rank") == {"0": 4.0, "1": 3.0}
    assert read_total(page, N, "dp_rank") == 7.0 and read_total(page, N, None) == 3.5
    assert read_total(f"{N} 5\n", N, "dp_rank") == 5.0 and read_total("", N, "dp_rank") is None


def test_label_values_are_read_pair_by_pair_with_their_escapes():
    """A value holding an escaped quote, or text that looks like another label, is one value: the walk
    used to stop at the escaped quote and to find ``b="`` inside ``a``'s value."""
    from steersman.engines.promtext import label_value

    labels = r'model_name="my \"x\" m",a="x,b=\"9\"",b="2",path="c:\\d\nz"'
    assert label_value(labels, "model_name") == 'my "x" m'
    assert label_value(labels, "a") == 'x,b="9"'
    assert label_value(labels, "b") == "2"
    assert label_value(labels, "path") == "c:\\d\nz"
    assert label_value(labels, "x") is None and label_value('a="unterminated', "a") is None
    page = f'{N}{{model_name="q\\"1",state="warm"}} 1.0\n{N}{{model_name="q\\"1",state="cold"}} 0.0\n'
    assert read_labelled(page, N, "state") == {"warm": 1.0, "cold": 0.0}
