"""The engine-sim children of a ``simulated:`` fleet die with the process that started them, even when it is killed
with SIGKILL (no chance to stop them): PR_SET_PDEATHSIG, as the llama-server children have."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

_PARENT = """
import asyncio, sys
import uvloop
from steersman.fleet.config import SimReplicaConfig, SimulatedFleetConfig
from steersman.fleet.embedded import SimulatedFleet

async def main():
    fleet = SimulatedFleet(SimulatedFleetConfig([SimReplicaConfig("H100", "llama-3.1-8b")]))
    await fleet.start()
    print("children", *(p.pid for p in fleet.procs), flush=True)
    await asyncio.sleep(120)  # killed long before

uvloop.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_engine_sims_die_when_the_gateway_is_sigkilled():
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    children: list[psutil.Process] = []
    try:
        line = parent.stdout.readline()
        assert line.startswith("children"), f"parent exited ({parent.poll()}) before its engine-sim was ready"
        children = [psutil.Process(int(p)) for p in line.split()[1:]]
        assert children and all(c.is_running() for c in children)
        parent.kill()
        parent.wait(10)
        _, alive = psutil.wait_procs(children, timeout=10)  # the kernel's SIGKILL: at once, not after a grace
        assert not alive, f"engine-sim children left running after their parent's SIGKILL: {alive}"
    finally:
        if parent.poll() is None:
            parent.kill()
        for c in children:
            if c.is_running():
                c.kill()
