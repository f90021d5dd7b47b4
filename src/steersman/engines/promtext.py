"""A fast reader of selected samples from Prometheus text exposition.

The gateway scrapes every engine every 50 ms; parsing a whole vLLM page (every
histogram bucket is a line) costs milliseconds, so this finds only the sample
names asked for with ``str.find`` and sums their values across label sets (one
vLLM process may expose several ``engine`` labels).  What must not be summed across
engines (a usage ratio, a capacity given in an info gauge's labels) is read per label
set with :func:`read_series`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

__all__ = ["read_samples", "read_labelled", "read_series", "label_value"]


def _lines_of(text: str, name: str) -> Iterator[tuple[str, str]]:
    """``(labels, rest)`` of every sample line whose metric name is exactly ``name``.

    The exposition format keeps a metric's lines together, so the scan stops at the
    first line after them that is not a sample of ``name`` (no search to the end).
    """
    n = len(name)
    pos = 0 if text.startswith(name) else text.find("\n" + name) + 1
    while pos > 0 or (pos == 0 and text.startswith(name)):
        after = pos + n
        end = text.find("\n", after)
        if end == -1:
            end = len(text)
        ch = text[after : after + 1]
        if ch == "{":
            close = text.rfind("}", after, end)
            if close != -1:
                yield text[after + 1 : close], text[close + 1 : end]
        elif ch == " ":
            yield "", text[after:end]
        if not text.startswith(name, end + 1):
            # the group ended here, unless this line was another metric sharing the prefix
            if ch in ("{", " "):
                return
            nxt = text.find("\n" + name, end)
            if nxt == -1:
                return
            pos = nxt + 1
            continue
        pos = end + 1


def _value(rest: str) -> float | None:
    parts = rest.split()
    if not parts:
        return None
    try:
        v = float(parts[0])
    except ValueError:
        return None
    return None if v != v else v  # drop NaN


def read_samples(text: str, names: Mapping[str, str]) -> dict[str, float]:
    """``{key: sum of samples}`` for ``names = {sample_name: key}``; absent keys are left out."""
    out: dict[str, float] = {}
    for sample, key in names.items():
        for _, rest in _lines_of(text, sample):
            v = _value(rest)
            if v is not None:
                out[key] = out.get(key, 0.0) + v
    return out


def label_value(labels: str, label: str) -> str | None:
    """The value of ``label`` in a sample's label text (``a="1",b="2"``); None when absent.

    Matched as a whole name: ``block_size`` is not ``hash_block_size`` (vLLM's cache_config_info has both).
    """
    needle = f'{label}="'
    i = labels.find(needle)
    while i > 0 and labels[i - 1] not in ", {":
        i = labels.find(needle, i + 1)
    if i == -1:
        return None
    j = labels.find('"', i + len(needle))
    return labels[i + len(needle) : j] if j != -1 else None


def read_labelled(text: str, name: str, label: str) -> dict[str, float]:
    """``{label value: sample value}`` for one family, e.g. a one-hot state gauge."""
    out: dict[str, float] = {}
    for labels, rest in _lines_of(text, name):
        key = label_value(labels, label)
        v = _value(rest)
        if key is not None and v is not None:
            out[key] = v
    return out


def read_series(text: str, name: str) -> Iterator[tuple[str, float]]:
    """``(label text, value)`` of every sample of ``name`` (NaN and unparsable values left out)."""
    for labels, rest in _lines_of(text, name):
        v = _value(rest)
        if v is not None:
            yield labels, v
