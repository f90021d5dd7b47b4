"""Trace replay: Azure CSV and Mooncake JSONL, block hash expansion, time-scale knob, labels."""

from __future__ import annotations

import csv
import math
from collections import Counter

import numpy as np
import orjson
import pytest

from steersman.twin.workload import AgentSource, DailyCurve, Mix, TraceSource, load_trace
from steersman.twin.workload.traces import TraceError
from wl_helpers import common_prefix, content, drive

BS = 16


@pytest.fixture(scope="module")
def traces(shared_dir):
    return shared_dir / "traces"


@pytest.fixture(scope="module")
def mooncake_rows(traces):
    with (traces / "mooncake-synthetic.jsonl").open("rb") as f:
        return [orjson.loads(line) for line in f]


def _all(w):
    w.start()
    return w.next_batch(math.inf)


def test_azure_replays_the_csv(traces):
    path = traces / "azure-llm-2023-code.csv"
    with path.open() as f:
        rows = list(csv.DictReader(f))
    got = _all(TraceSource(path, tenant="t", model="m", slo="batch"))
    assert len(got) == len(rows) == 8819
    assert [a.prompt_tokens for a in got[:50]] == [int(r["ContextTokens"]) for r in rows[:50]]
    assert [a.output_tokens for a in got[:50]] == [int(r["GeneratedTokens"]) for r in rows[:50]]
    assert got[0].time == 0.0 and got[1].time == pytest.approx(0.052, abs=1e-6)  # 18:17:03.97996 -> .03196
    assert got[-1].time == pytest.approx(57 * 60 + 15.948, abs=0.01)
    assert all(b.time >= a.time for a, b in zip(got, got[1:]))
    assert {(a.tenant, a.model, a.slo_class, a.workflow, a.max_tokens) for a in got} == {("t", "m", "batch", None, None)}
    assert all(len(a.block_hashes) == a.prompt_tokens // BS for a in got)
    # no prefix information: every prompt is unique
    assert sum(len(a.block_hashes) for a in got) == len({h for a in got for h in a.block_hashes})


def test_mooncake_ids_expand_to_chained_16_token_blocks(traces, mooncake_rows):
    got = _all(TraceSource(traces / "mooncake-synthetic.jsonl"))
    assert len(got) == len(mooncake_rows) == 3993
    assert [a.time for a in got[:20]] == [r["timestamp"] / 1000 for r in mooncake_rows[:20]]
    rng = np.random.default_rng(0)
    by_first: dict[int, list[int]] = {}
    for i, r in enumerate(mooncake_rows):
        by_first.setdefault(r["hash_ids"][0] if r["hash_ids"] else -1, []).append(i)
    pairs = [(i, i + 1) for i in range(300)] + [tuple(rng.integers(0, len(got), 2)) for _ in range(1000)]
    pairs += [(g[k], g[k + 1]) for g in by_first.values() for k in range(len(g) - 1)][:3000]  # shared prefixes
    shared_some = 0
    for i, j in pairs:
        ra, rb, a, b = mooncake_rows[i], mooncake_rows[j], got[i], got[j]
        assert len(a.block_hashes) == ra["input_length"] // BS and a.output_tokens == max(ra["output_length"], 1)
        ids = common_prefix(ra["hash_ids"], rb["hash_ids"])
        expect = min(32 * ids, len(a.block_hashes), len(b.block_hashes))
        assert common_prefix(a.block_hashes, b.block_hashes) == expect, (i, j)
        shared_some += expect > 0
    assert shared_some > 100  # the trace does share prefixes


def test_hashes_do_not_depend_on_how_the_trace_is_pulled(traces):
    path = traces / "mooncake-synthetic.jsonl"
    whole = _all(TraceSource(path, limit=1500))
    w = TraceSource(path, limit=1500)
    w.start()
    pieces, t = [], 0.0
    while not w.next_time == math.inf:
        t += 3.7
        pieces += w.next_batch(t)
    assert [content(a) for a in pieces] == [content(a) for a in whole]
    assert [a.seq for a in pieces] == list(range(1500))


def test_speed_limit_offset(traces):
    path = traces / "azure-llm-2023-conv.csv"
    base = _all(TraceSource(path, limit=2000))
    fast = _all(TraceSource(path, limit=2000, speed=4.0, offset_s=100.0))
    assert len(base) == len(fast) == 2000
    for a, b in zip(base, fast):
        assert b.time == pytest.approx(100.0 + a.time / 4)
        assert (a.prompt_tokens, a.output_tokens) == (b.prompt_tokens, b.output_tokens)
    slow = _all(TraceSource(path, limit=10, speed=0.5))
    assert slow[-1].time == pytest.approx(2 * base[9].time)
    assert TraceSource(path, limit=2000, speed=4.0).offered_load().requests_per_s == pytest.approx(
        4 * TraceSource(path, limit=2000).offered_load().requests_per_s)
    cut = _all(TraceSource(path, end_s=60.0))
    assert cut and max(a.time for a in cut) < 60.0 and len(cut) == sum(a.time < 60.0 for a in _all(TraceSource(path, limit=5000)))


def test_repeat_plays_again_with_fresh_prompts(traces):
    path = traces / "mooncake-synthetic.jsonl"
    d = load_trace(path)
    got = _all(TraceSource(path, repeat=2))
    n = len(d)
    assert len(got) == 2 * n
    first, second = got[:n], got[n:]
    assert second[0].time > first[-1].time
    assert [b.time - second[0].time for b in second[:50]] == pytest.approx([a.time for a in first[:50]])
    assert [a.prompt_tokens for a in first] == [b.prompt_tokens for b in second]
    h1 = {h for a in first for h in a.block_hashes}
    assert all(h not in h1 for b in second[:200] for h in b.block_hashes)
    # ... but the same sharing structure inside each repetition
    assert common_prefix(second[5].block_hashes, second[6].block_hashes) == common_prefix(
        first[5].block_hashes, first[6].block_hashes)


def test_trace_is_open_loop_and_done_when_all_complete(traces):
    w = TraceSource(traces / "azure-llm-2023-conv.csv", limit=100)
    seen, done = drive(w, latency=2.0)
    assert len(seen) == 100 and all(fu == [] for *_, fu in done)
    assert w.done and w.stats.completed == 100
    with pytest.raises(ValueError):
        w.on_complete(seen[0], 1e6, True)


def test_tenant_and_slo_mixes_and_max_tokens(traces):
    path = traces / "azure-llm-2023-conv.csv"
    kw = dict(tenant={"acme": 3, "free": 1}, slo={"interactive": 1, "batch": 1}, seed=4, max_tokens=100)
    got = _all(TraceSource(path, **kw))
    again = _all(TraceSource(path, **kw))
    assert [content(a) for a in got] == [content(a) for a in again]
    ten = Counter(a.tenant for a in got)
    assert ten["acme"] / len(got) == pytest.approx(0.75, abs=0.02)
    assert Counter(a.slo_class for a in got)["batch"] / len(got) == pytest.approx(0.5, abs=0.02)
    assert all(a.max_tokens == 100 and a.output_tokens <= 100 for a in got)
    exact = _all(TraceSource(path, limit=50, max_tokens="exact"))
    assert all(a.max_tokens == a.output_tokens for a in exact)


def test_offered_load_of_a_trace(traces):
    path = traces / "azure-llm-2023-conv.csv"
    d = load_trace(path)
    load = TraceSource(path, speed=2.0).offered_load()
    span = float(d.times[-1]) / 2
    n = len(d)
    assert load.requests_per_s == pytest.approx(n / span, rel=1e-3)
    assert load.prompt_tokens_per_s == pytest.approx(d.prompt.sum() / span, rel=1e-3)
    assert load.output_tokens_per_s == pytest.approx(d.output.sum() / span, rel=1e-3)
    assert load.new_prompt_tokens_per_s == load.prompt_tokens_per_s  # unique prompts
    mc = TraceSource(traces / "mooncake-synthetic.jsonl").offered_load()
    assert 0.1 < mc.new_prompt_tokens_per_s / mc.prompt_tokens_per_s < 0.9  # prefix sharing


def test_new_prompt_tokens_match_an_unbounded_cache(traces):
    got = _all(TraceSource(traces / "mooncake-synthetic.jsonl", limit=800))
    seen: set[int] = set()
    new = []
    for a in got:
        m = 0
        for h in a.block_hashes:
            if h not in seen:
                break
            m += 1
        new.append(a.prompt_tokens - BS * m)
        seen.update(a.block_hashes)
    assert new == load_trace(traces / "mooncake-synthetic.jsonl").new_prompt_tokens(BS)[:800].tolist()


def test_curve_warps_a_trace(traces):
    # a day squeezed into 1000 s; the trace (~1 h, replayed 10x faster: ~350 s) starts at the trough
    curve = DailyCurve.sinusoid(trough=0.1, peak=1.0, peak_hour=12, period_s=1000.0, start_hour=0.0)
    got = _all(TraceSource(traces / "azure-llm-2023-conv.csv", speed=10.0, curve=curve))
    t = np.array([a.time for a in got])
    assert np.all(np.diff(t) >= 0)
    early = np.sum(t < 100) / 100
    late = np.sum((t >= t[-1] - 100) & (t < t[-1])) / 100
    assert late > 2 * early  # the rate climbs with the curve


def test_bad_trace_inputs(traces, tmp_path):
    with pytest.raises(TraceError, match="format"):
        load_trace(tmp_path / "x.txt")
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match="header"):
        load_trace(bad)
    with pytest.raises(TraceError, match="speed"):
        TraceSource(traces / "azure-llm-2023-conv.csv", speed=0)
    with pytest.raises(TraceError, match="block_size"):
        TraceSource(traces / "mooncake-synthetic.jsonl", block_size=24)


def test_completing_a_trace_arrival_twice_is_an_error_while_others_are_in_flight(traces):
    w = TraceSource(traces / "azure-llm-2023-conv.csv", limit=10)
    w.start()
    sent = w.next_batch(math.inf)
    w.on_complete(sent[0], 1.0, True)
    with pytest.raises(ValueError, match="not in flight: seq 0"):
        w.on_complete(sent[0], 2.0, True)
    for a in sent[1:]:
        w.on_complete(a, 3.0, True)
    assert w.done and w.stats.completed == 10
    # in a mix, which numbers the arrivals after the trace handed them out
    m = Mix([AgentSource("chatbot", tasks_per_s=5.0, max_tasks=3),
             TraceSource(traces / "azure-llm-2023-conv.csv", limit=5)])
    m.start()
    (a, *_) = [x for x in m.next_batch(math.inf) if x.workflow is None]
    m.on_complete(a, a.time + 1, False)
    with pytest.raises(ValueError, match=f"not in flight: seq {a.seq}"):
        m.on_complete(a, a.time + 2, True)


@pytest.mark.parametrize("ids, got", [("[null]", "None"), ("[{}]", "{}"), ('[1, "a"]', "'a'"), ("[1.7, 2]", "1.7"),
                                      ("[true]", "True")])
def test_a_bad_mooncake_hash_id_is_named_with_its_file_and_line(tmp_path, ids, got):
    good = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
    p = tmp_path / "t.jsonl"
    p.write_text(good + good.replace("[1, 2]", ids))
    j = 1 if ids.startswith("[1,") else 0
    with pytest.raises(TraceError, match=rf"t\.jsonl:2: bad record: hash_ids\[{j}\] must be an integer, got {got}"):
        load_trace(p)


def test_azure_csv_with_a_byte_order_mark_and_blank_lines_loads_and_a_directory_is_named(tmp_path):
    p = tmp_path / "excel.csv"
    rows = "2023-11-16 18:17:03.9799600,4808,10\n   \n2023-11-16 18:17:04.0319600,3180,8\n\n"
    p.write_text("\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n" + rows, encoding="utf-8")
    d = load_trace(p)
    assert d.prompt.tolist() == [4808, 3180] and d.output.tolist() == [10, 8]
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(TraceError, match=r"dir\.csv: it is a directory"):
        load_trace(tmp_path / "dir.csv")
