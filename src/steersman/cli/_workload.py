"""The workload of ``simulate`` and ``plan``: a spec file, or a trace replayed as one."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer

__all__ = ["workload_spec", "check_duration", "parse_loads"]


def workload_spec(workload: Path | None, trace: Path | None, speed: float, limit: int | None,
                  model: str) -> tuple[dict[str, Any], Path | None]:
    """(spec, the directory its relative paths start from); a trace becomes one ``kind: trace`` source.

    Raises typer.BadParameter unless exactly one of ``workload`` and ``trace`` is given, OSError / WorkloadSpecError
    on a file that cannot be read."""
    from steersman.twin.run import read_spec

    if (workload is None) == (trace is None):
        raise typer.BadParameter("give exactly one of --workload or --trace")
    if workload is not None:
        return read_spec(workload)
    src: dict[str, Any] = {"kind": "trace", "path": str(trace.resolve()), "speed": speed, "model": model}  # type: ignore[union-attr]
    if limit is not None:
        src["limit"] = limit
    return {"model": model, "sources": [src]}, None


def check_duration(duration: float | None) -> None:
    """ValueError naming ``--duration`` unless it is None or a finite number of seconds > 0."""
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise ValueError(f"--duration must be a number of seconds > 0, got {duration:g}")


def parse_loads(text: str) -> list[float]:
    """The ``--load`` multipliers (``0.5,1,1.5``); ValueError naming ``--load`` for one that is not a finite
    number > 0, or none at all."""
    loads = []
    for x in text.split(","):
        if not x.strip():
            continue
        try:
            k = float(x)
        except ValueError:
            raise ValueError(f"--load: {x.strip()!r} is not a number") from None
        if not (math.isfinite(k) and k > 0):
            raise ValueError(f"--load multipliers must be finite numbers > 0, got {x.strip()}")
        loads.append(k)
    if not loads:
        raise ValueError(f"--load: no multiplier in {text!r} (e.g. 0.5,1,1.5)")
    return loads
