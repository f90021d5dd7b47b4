"""Generation cost per request, printed (not asserted: wall time depends on the machine).

Run with ``-s`` to see the table.  Cost grows with prompt length: every call's
tuple of block hashes is built (new blocks hashed, earlier ones copied), so the
blocks-per-request column explains most differences between generators.
"""

from __future__ import annotations

import gc

import pytest

from steersman.twin.workload import AgentSource, TraceSource
from wl_helpers import drive

N = 30_000


def _cases(traces):
    return {
        "chatbot": lambda: AgentSource("chatbot", tasks_per_s=40.0, seed=1),
        "copilot": lambda: AgentSource("copilot", tasks_per_s=4.0, seed=1),
        "research": lambda: AgentSource("research", tasks_per_s=1.0, seed=1),
        "autonomous": lambda: AgentSource("autonomous", tasks_per_s=0.2, seed=1),
        "azure-conv": lambda: TraceSource(traces / "azure-llm-2023-conv.csv", repeat=3),
        "azure-code": lambda: TraceSource(traces / "azure-llm-2023-code.csv", repeat=4),
        "mooncake": lambda: TraceSource(traces / "mooncake-synthetic.jsonl", repeat=2),
    }


@pytest.mark.parametrize("gc_on", [True, False], ids=["gc-on", "gc-off"])
def test_print_generation_cost(shared_dir, gc_on, capsys):
    rows = []
    was = gc.isenabled()
    try:
        if not gc_on:
            gc.disable()
        for name, make in _cases(shared_dir / "traces").items():
            (n, nblocks), _, spent = drive(make(), latency=0.5, max_requests=N, timed=True, keep=False)
            blocks = nblocks / n
            rows.append(f"{name:11s} {n:7d} req  {spent / n * 1e6:7.2f} us/req  {blocks:7.0f} blocks/req  "
                        f"{spent / n / max(blocks, 1) * 1e9:6.1f} ns/block")
    finally:
        if was:
            gc.enable()
    with capsys.disabled():
        print(f"\nworkload generation cost ({'gc on' if gc_on else 'gc off'}):\n  " + "\n  ".join(rows))
