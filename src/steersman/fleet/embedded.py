"""Starts the engine-sim replicas of a ``simulated:`` fleet as child processes.

Each replica is ``python -m steersman engine-sim --port 0 ...``; the parent reads
the ``engine-sim ready <url>`` line to learn its address, and stops every child
on exit (SIGTERM, then SIGKILL after a grace period).  Each child also gets
``PR_SET_PDEATHSIG`` as the llama-server ones do (:mod:`steersman.fleet.processes`):
a gateway killed with SIGKILL (OOM killer, ``kubectl delete --grace-period=0``)
leaves no engine-sim behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from steersman.fleet.config import EndpointConfig, SimulatedFleetConfig, check_spawnable, sim_replica_names
from steersman.fleet.processes import DIE_WITH_PARENT, OWN_SESSION
from steersman.sim import gpu_profile, model_profile

__all__ = ["SimulatedFleet"]

_READY = "engine-sim ready "

log = logging.getLogger("steersman.fleet")


def twin_only_roles(cfg: SimulatedFleetConfig) -> list[str]:
    """The replica groups whose ``role`` (prefill/decode disaggregation) only the digital twin models."""
    return [f"{r.count} x {r.gpu} {r.model} (role: {r.role})" for r in cfg.replicas if r.role != "both"]


class SimulatedFleet:
    def __init__(self, cfg: SimulatedFleetConfig, host: str = "127.0.0.1", ready_timeout_s: float = 60.0,
                 kv_events: bool = False) -> None:
        check_spawnable(cfg, "fleet config")  # FleetConfigError: more processes than the machine should start
        self.cfg = cfg
        self.host = host
        self.kv_events = kv_events  # each replica publishes its KV events (scheduler.kv_events); the gateway reads them
        self.ready_timeout_s = ready_timeout_s
        self.procs: list[asyncio.subprocess.Process] = []
        self.endpoints: list[EndpointConfig] = []

    async def start(self) -> list[EndpointConfig]:
        roles = twin_only_roles(self.cfg)
        if roles:
            log.warning("prefill/decode roles are modelled by `steersman simulate` only: live, every replica "
                        "serves requests whole (%s)", "; ".join(roles))
        # fail fast on a typo, before spawning anything
        plans = [(name, spec, gpu_profile(spec.gpu), model_profile(spec.model))
                 for name, spec in sim_replica_names(self.cfg)]
        # a bounded number at once (a core's worth, at least 8): each child imports and loads its kernels on start-up
        at_once = asyncio.Semaphore(max(8, os.cpu_count() or 1))

        async def spawn(plan) -> EndpointConfig:
            async with at_once:
                return await self._spawn(*plan)

        tasks = [asyncio.ensure_future(spawn(p)) for p in plans]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:  # those still waiting for their turn start nothing after the stop below
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.stop()
            raise
        self.endpoints = list(results)
        return self.endpoints

    async def _spawn(self, name, spec, gpu, model) -> EndpointConfig:
        args = [
            sys.executable, "-m", "steersman", "engine-sim",
            "--gpu", gpu.name, "--model", spec.model, "--port", "0", "--host", self.host,
            "--speedup", str(self.cfg.speedup), "--tp", str(spec.tp),
        ]
        if spec.served_model_name:
            args += ["--served-model-name", spec.served_model_name]
        if spec.cold_start:
            args.append("--cold-start")
        for lora in spec.lora_modules:
            args += ["--lora-modules", lora]
        if spec.scheduling != "fcfs":
            args += ["--scheduling-policy", spec.scheduling]
        if self.cfg.otlp_traces_endpoint:
            args += ["--otlp-traces-endpoint", self.cfg.otlp_traces_endpoint]
        if self.kv_events:
            args += ["--kv-events-endpoint", f"tcp://{self.host}:*", "--kv-events-replay-endpoint", f"tcp://{self.host}:*"]
        proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE, stderr=None,
                                                    stdin=asyncio.subprocess.DEVNULL,
                                                    preexec_fn=DIE_WITH_PARENT, start_new_session=OWN_SESSION)
        self.procs.append(proc)
        assert proc.stdout is not None
        try:
            while True:
                line = (await asyncio.wait_for(proc.stdout.readline(), self.ready_timeout_s)).decode()
                if not line:
                    raise RuntimeError(f"engine-sim {name} exited before it was ready (code {await proc.wait()})")
                if line.startswith(_READY):
                    words = line[len(_READY):].split()
                    url = words[0]
                    events = next((w.split("=", 1)[1] for w in words if w.startswith("kv_events=")), None)
                    replay = next((w.split("=", 1)[1] for w in words if w.startswith("kv_events_replay=")), None)
                    break
        except TimeoutError:
            raise RuntimeError(f"engine-sim {name} was not ready within {self.ready_timeout_s:.0f} s") from None
        asyncio.get_running_loop().create_task(_drain(proc.stdout))
        return EndpointConfig(
            url=url, name=name, engine="engine-sim", gpu=gpu.name, pool=spec.pool, tp=spec.tp,
            models=[spec.served_model_name or spec.model], price_per_hour=gpu.price_per_hour * spec.tp,
            scheduling=spec.scheduling, kv_events=events, kv_events_replay=replay, lora_modules=list(spec.lora_modules),
            model_profile=spec.model,  # (under a served_model_name, the model it simulates)
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every replica, then SIGKILL those still running after ``grace_s`` (in parallel)."""
        procs, self.procs = self.procs, []
        for p in procs:
            if p.returncode is None:
                p.terminate()
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), grace_s)
        except TimeoutError:
            for p in procs:
                if p.returncode is None:
                    p.kill()
            await asyncio.gather(*(p.wait() for p in procs))


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass
