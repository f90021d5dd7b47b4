"""Running the twin for several policies and load levels on one fleet and one workload.

Every (policy, load) run gets a fresh workload from the same spec and seed, so
each policy sees exactly the same arrivals (closed-loop agents react to each
policy's own latencies, as real users would).  ``load`` scales the spec's
offered rate: trace ``speed``, agent ``tasks_per_s`` and ``users`` (rounded: a
population stays whole, so a run lists the populations it rounded, with the
factor they really got, in ``users_rounded``).  ``duration_s`` (``--duration``)
replaces the spec's ``duration_s``, so it can lengthen a run as well as cut it.
The spec's ``drills:`` (:mod:`steersman.twin.drills`) are put on every run's
timeline, at the same simulated times whatever the load.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from steersman.config import DEFAULTS
from steersman.config._yaml import load_yaml
from steersman.fleet.config import FleetConfig, make_profile
from steersman.policy import make_policy
from steersman.twin.core import Twin, TwinConfig
from steersman.twin.drills import parse_drills, resolve, schedule_drills
from steersman.twin.fleet import TwinFleet
from steersman.twin.metrics import per_replica, summarize, timeline, window_for
from steersman.twin.results import OK, Recorder
from steersman.twin.workload import Mix, WorkloadSpecError, load_workload

__all__ = ["Experiment", "scale_spec", "policy_for", "read_spec", "check_workload"]


def read_spec(path: str | Path) -> tuple[dict, Path]:
    """(the workload spec in the YAML file ``path``, its directory); OSError, or WorkloadSpecError naming the file.
    Read as the fleet file is (:func:`~steersman.config._yaml.load_yaml`): a key given twice is an error naming it,
    numbers are YAML 1.2's (``1e3`` a number, ``010`` ten)."""
    p = Path(path)
    try:
        spec = load_yaml(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise WorkloadSpecError(f"cannot read {p}: not UTF-8 text") from None
    except yaml.YAMLError as e:
        raise WorkloadSpecError(f"{p}: invalid YAML: {e}") from None
    if not isinstance(spec, dict):
        raise WorkloadSpecError(f"{p}: a workload spec is a mapping (model, sources, ...), got {type(spec).__name__}")
    return spec, p.parent


def scale_spec(spec: Mapping[str, Any], k: float) -> dict:
    """The same workload at ``k`` times its offered rate."""
    out = copy.deepcopy(dict(spec))
    sources = out.get("sources")
    for s in sources if isinstance(sources, list) else []:
        if not isinstance(s, dict):
            continue  # the spec's parser names what is wrong with it
        if s.get("kind") == "trace":
            speed = s.get("speed")
            s["speed"] = _scaled(1.0 if speed is None else speed, k)  # null is the parser's 1.0
        else:
            if "tasks_per_s" in s:
                s["tasks_per_s"] = _scaled(s["tasks_per_s"], k)
            users = s.get("users")
            if isinstance(users, int) and not isinstance(users, bool) and users >= 1:  # else the parser names it
                s["users"] = max(1, math.floor(users * k + 0.5))  # half up: 10 users at 0.25x are 3 (round(): 2)
    return out


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _scaled(v: object, k: float) -> object:
    """``v`` x ``k`` if it is a number; anything else as it is, for the spec's parser to report with its field."""
    return v * k if _number(v) else v


def check_workload(wl: Mix, duration_s: float | None = None,
                   block_size: int = DEFAULTS.engine.block_size) -> None:
    """WorkloadSpecError for a workload the twin would run wrongly or forever: hashed in blocks other than the
    engines' (their prefix caches would match nothing, or fail every request), or with a source that never ends
    and no ``duration_s`` to stop it."""
    for src in wl.leaves:
        if src.block_size != block_size:
            raise WorkloadSpecError(f"workload spec: block_size must be {block_size}, the engines' KV block size "
                                    f"(their prefix caches match prompts block by block), got {src.block_size}")
    if duration_s is None:
        for src in wl.leaves:
            if src.never_ends:
                cap = "tasks_per_user" if src.users is not None else "max_tasks"
                raise WorkloadSpecError(f"workload source {src.name!r} never ends: set duration_s, end_s, {cap} "
                                        f"or --duration")


def policy_for(name: str, cfg: FleetConfig):
    if name in cfg.profiles:
        return make_profile(name, cfg.profiles[name], cfg.scheduler)
    return make_policy(name, cfg.scheduler)


@dataclass
class Experiment:
    fleet: FleetConfig
    spec: Mapping[str, Any]
    base_dir: Path | None = None
    seed: int | None = None  # None: the spec's seed, else 0
    duration_s: float | None = None  # replaces the spec's duration_s
    timeline_s: float | None = None  # timeline window (None: ~40 windows over the first run, kept for the rest)
    runs: dict[str, dict[float, dict]] = field(default_factory=dict)
    samples: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    #: the recorder of the latest run (per-request columns, for analyses beyond the summary)
    last: Recorder | None = None
    #: run the gateway's reliability mechanisms (ejection, breakers, adaptive concurrency, retries, stream
    #: continuation) with the fleet file's settings; None: when the spec has failure drills (what the live
    #: gateway would do then), off otherwise (policy comparisons stay as they were measured)
    reliability: bool | None = None

    @property
    def used_seed(self) -> int:
        """The seed the runs use (the spec's when none was given; the spec's parser validates it)."""
        if self.seed is not None:
            return self.seed
        s = self.spec.get("seed")
        return 0 if s is None else s

    def _workload(self, load: float) -> Mix:
        spec = scale_spec(self.spec, load)
        if self.duration_s is not None:  # every source's default end_s, so --duration can lengthen a run too
            spec["duration_s"] = self.duration_s
        return load_workload(spec, self.used_seed, base_dir=self.base_dir, slo_classes=self.fleet.scheduler.slo_classes,
                             admission=self.fleet.admission)

    def check(self, policies: Sequence[str] = ()) -> None:
        """Raise what a run would fail on, before any runs: the fleet's replicas (FleetConfigError), the workload
        spec and drills (WorkloadSpecError, ValueError), an unknown policy (KeyError), and a workload asking for a
        model no replica serves (WorkloadSpecError: the twin would refuse every such request, as the gateway
        answers 404, and report a run of nothing), in blocks other than the engines' or without an end
        (:func:`check_workload`)."""
        tf = TwinFleet.from_config(self.fleet)
        wl = self._workload(1.0)
        end = self.duration_s if self.duration_s is not None else self.spec.get("duration_s")
        check_workload(wl, end, tf.block_size)
        names = [p.name for p in tf.plans]
        for k, step in enumerate(parse_drills(self.spec.get("drills"))):
            resolve(step, names, f"drills[{k}].{step.action}")
            if isinstance(end, (int, float)) and step.at > end:  # no arrival after the end: it would change nothing
                raise WorkloadSpecError(f"drills[{k}].at ({step.at:g} s) is after the workload's end ({end:g} s)")
        for name in policies:
            policy_for(name, self.fleet)
        served = {p.served_model_name or p.model for p in tf.plans if p.role != "decode"}
        for src in getattr(wl, "leaves", ()):
            if src.model not in served:
                raise WorkloadSpecError(f"workload source {src.name!r} asks for model {src.model!r}, which no replica "
                                        f"of the fleet serves (it serves: {', '.join(sorted(served))})")

    def run(self, policy: str, load: float = 1.0, progress: Callable[[float, int], None] | None = None) -> dict:
        tf = TwinFleet.from_config(self.fleet)
        wl = self._workload(load)
        duration = self.duration_s if self.duration_s is not None else self.spec.get("duration_s")
        check_workload(wl, duration, tf.block_size)  # once a run, for callers that skip check (steersman plan)
        tenants = dict(getattr(wl, "tenants", None) or {})
        if self.fleet.tenants is not None:
            tenants.update(self.fleet.tenants.tenants)
        drills = parse_drills(self.spec.get("drills"))
        on = bool(drills) if self.reliability is None else self.reliability
        gw = self.fleet.gateway
        cfg = TwinConfig(duration_s=duration, seed=self.used_seed, reliability=self.fleet.reliability if on else None,
                         metrics_interval_s=gw.metrics_interval_s, unhealthy_after_failures=gw.unhealthy_after_failures)
        twin = Twin(tf, wl, policy_for(policy, self.fleet), tenants, cfg, progress)
        schedule_drills(twin, drills)
        rec = twin.run()
        self.last = rec
        s = summarize(rec)
        s["drills"] = [d.as_json() for d in drills]
        s["retries"] = retry_summary(twin.retries)
        if rounded := users_rounded(self.spec, wl, load):
            s["users_rounded"] = rounded
        if self.timeline_s is None:  # one window for every run of the experiment: timelines line up
            self.timeline_s = window_for(rec.duration)
        s["timeline"] = timeline(rec, self.timeline_s)
        s["per_replica"] = per_replica(rec)
        self.runs.setdefault(policy, {})[load] = s
        if load == 1.0 or policy not in self.samples:
            c = rec.arrays()
            ok = c["status"] == OK
            self.samples[policy] = {"ttft": (c["first"] - c["arrival"])[ok], "e2e": (c["finish"] - c["arrival"])[ok]}
        return s

    def sweep(self, policies: Sequence[str], loads: Sequence[float], progress_factory=None) -> None:
        for policy in policies:
            for load in loads:
                self.run(policy, load, progress_factory(policy, load) if progress_factory else None)


def users_rounded(spec: Mapping[str, Any], wl: Mix, load: float) -> list[dict]:
    """The user populations whose scaled count was rounded to whole users (at least one): the load each really
    got (``factor``: users run / the spec's users) instead of ``load``."""
    out = []
    for raw, src in zip(spec.get("sources") or (), wl.leaves):
        users = getattr(src, "users", None)
        if users is not None and abs(users - raw["users"] * load) > 1e-9 * users:  # 10 x 0.7 is 7 users, not rounded
            out.append({"source": src.name, "users": users, "factor": users / raw["users"]})
    return out


def retry_summary(retries) -> dict[str, int]:
    """What the gateway's retry logic did in a run (zeros when the reliability mechanisms were off)."""
    c = retries.counts if retries is not None else {}
    get = lambda *k: int(sum(c.get(x, 0) for x in k))  # noqa: E731
    return {"attempts": int(retries.retrier.attempts) if retries is not None else 0,
            "retried": get("retried", "rerouted", "evicted"), "continued": get("continued"),
            "gave_up": get("not_continuable", "attempts_exhausted", "budget_exhausted", "deadline"),
            "throttled": get("throttled")}
