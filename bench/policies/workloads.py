"""The workloads and the fleet of bench/policies (one fleet for all of them).

* ``azure-conv`` / ``azure-code``: the Azure LLM inference traces 2023 (no prefix
  sharing: every prompt is its own), SLO class ``standard`` (TTFT 2 s, TPOT 200 ms).
* ``mooncake``: the Mooncake trace, the **prefix-heavy** one (``hash_ids`` shared
  between requests: 122k prompt blocks, 44k distinct), SLO class ``standard``; played
  whole (3,993 requests; ``mooncake_requests`` caps it).  Its sharing builds up over the
  trace: with an infinite cache its first 1,500 requests would hit 24% of their prompt
  blocks, the whole trace 65%, so a prefix of it is not the prefix-heavy load the bench
  is for.
* ``agentic``: examples/agentic-mix.yaml -- copilots (critical tenant, interactive),
  a chatbot (standard), research agents (batch); the tasks are workflows.

The Azure traces replay their first ``requests`` requests; the agentic mix runs ``agentic_s``
simulated seconds of task arrivals (then drains).  ``load`` (set by the capacity
probe) scales the trace's speed or the mix's task rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT.parent / "shared" / "traces"
FLEET = ROOT / "examples" / "twin-fleet.yaml"
AGENTIC = ROOT / "examples" / "agentic-mix.yaml"

__all__ = ["Workload", "workloads", "FLEET", "bench_fleet"]


@dataclass(frozen=True)
class Workload:
    name: str
    spec: dict
    base_dir: Path
    prefix_heavy: bool = False
    agentic: bool = False


def _trace(file: str, requests: int | None) -> dict:
    return {"model": "llama-3.1-8b",
            "sources": [{"kind": "trace", "path": str(TRACES / file), "slo": "standard", "limit": requests}]}


def workloads(requests: int, agentic_s: float, mooncake_requests: int | None = None) -> list[Workload]:
    mix = yaml.safe_load(AGENTIC.read_text())
    mix["duration_s"] = agentic_s
    return [
        Workload("azure-conv", _trace("azure-llm-2023-conv.csv", requests), ROOT),
        Workload("azure-code", _trace("azure-llm-2023-code.csv", requests), ROOT),
        Workload("mooncake", _trace("mooncake-synthetic.jsonl", mooncake_requests), ROOT, prefix_heavy=True),
        Workload("agentic", mix, AGENTIC.parent, agentic=True),
    ]


def bench_fleet(engine_scheduling: str = "fcfs"):
    """examples/twin-fleet.yaml, every replica's engine on ``engine_scheduling`` (fcfs: vLLM's default)."""
    import msgspec

    from steersman.fleet.config import load_fleet

    fleet = load_fleet(FLEET)
    if engine_scheduling == "fcfs":
        return fleet
    sim = fleet.simulated
    reps = [msgspec.structs.replace(r, scheduling=engine_scheduling) for r in sim.replicas]
    return msgspec.structs.replace(fleet, simulated=msgspec.structs.replace(sim, replicas=reps))
