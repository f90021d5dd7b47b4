"""The workload of ``simulate`` and ``plan``: a spec file, or a trace replayed as one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

__all__ = ["workload_spec"]


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
