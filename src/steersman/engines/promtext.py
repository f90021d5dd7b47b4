"""A fast reader of selected samples from Prometheus text exposition.

The gateway scrapes every engine every 50 ms; prometheus_client's parser costs
milliseconds on a vLLM page (every histogram bucket is a line), so this reads
only the families asked for, summing samples across label sets (one vLLM
process may expose several ``engine`` labels).  Label filters select samples of
families like ``steersman_sim:weights_state{state="warm"}``.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["read_samples", "read_labelled"]


def _split(line: str) -> tuple[str, str, str] | None:
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        close = line.rfind("}")
        if close == -1:
            return None
        name, labels, rest = line[:brace], line[brace + 1 : close], line[close + 1 :]
    elif space != -1:
        name, labels, rest = line[:space], "", line[space:]
    else:
        return None
    return name, labels, rest


def _value(rest: str) -> float | None:
    parts = rest.split()
    if not parts:
        return None
    try:
        return float(parts[0])
    except ValueError:
        return None


def read_samples(text: str, names: Mapping[str, str]) -> dict[str, float]:
    """``{key: sum of samples}`` for ``names = {sample_name: key}``; absent keys are left out."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        parts = _split(line)
        if parts is None:
            continue
        key = names.get(parts[0])
        if key is None:
            continue
        v = _value(parts[2])
        if v is not None and v == v:  # drop NaN
            out[key] = out.get(key, 0.0) + v
    return out


def read_labelled(text: str, name: str, label: str) -> dict[str, float]:
    """``{label value: sample value}`` for one family, e.g. a one-hot state gauge."""
    out: dict[str, float] = {}
    needle = f'{label}="'
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        parts = _split(line)
        if parts is None or parts[0] != name:
            continue
        i = parts[1].find(needle)
        if i == -1:
            continue
        j = parts[1].find('"', i + len(needle))
        v = _value(parts[2])
        if j != -1 and v is not None:
            out[parts[1][i + len(needle) : j]] = v
    return out
