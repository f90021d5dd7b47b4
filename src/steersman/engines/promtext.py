"""A fast reader of selected samples from Prometheus text exposition.

The gateway scrapes every engine every 50 ms; parsing a whole vLLM page (every
histogram bucket is a line) costs milliseconds, so this finds only the sample
names asked for with ``str.find`` and sums their values across label sets (one
vLLM process may expose several ``engine`` labels).  What must not be summed across
engines (a usage ratio, a capacity given in an info gauge's labels) is read per label
set with :func:`read_series`, or one figure per engine with :func:`read_per_label` and
:func:`read_total` (series repeating one engine's figure count once).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

__all__ = ["read_samples", "read_labelled", "read_series", "read_per_label", "read_total", "label_value"]


def _lines_of(text: str, name: str) -> Iterator[tuple[str, str]]:
    """``(labels, rest)`` of every sample line whose metric name is exactly ``name``.

    The exposition format keeps a metric's lines together, so the scan stops at the first sample line after
    them that is not one of ``name`` (no search to the end of the page).  Blank and ``#`` lines inside the
    group are skipped, blanks may part the name from its labels, and lines may start with blanks (on a page
    that does: :func:`_first`): the format allows them (prometheus_client's parser reads them), though no
    exporter writes them.
    """
    n = len(name)
    seen = False  # a sample of ``name`` was read: the next line that is not one ends the group
    i = _first(text, name, 0)
    while i != -1:
        after = i + n
        end = text.find("\n", after)
        if end == -1:
            end = len(text)
        ch = text[after : after + 1]
        if ch == "{":
            close = text.rfind("}", after, end)
            if close != -1:
                yield text[after + 1 : close], text[close + 1 : end]
        elif ch == " " or ch == "\t":
            rest = text[after:end]
            s = rest.lstrip(" \t")
            if s[:1] == "{":  # ``name {labels} value``
                close = s.rfind("}")
                if close != -1:
                    yield s[1:close], s[close + 1 :]
            else:
                yield "", rest
        elif seen:
            return  # another metric sharing the prefix (``name_extra``) follows the group
        else:
            i = _first(text, name, end)  # another metric sharing the prefix: the group is further on
            continue
        seen = True
        i = end + 1
        if not text.startswith(name, i):  # the group ends here, as a rule: at the next family's # HELP or sample
            c = text[i : i + 1]
            if c not in "#\r\n \t" or (c == "#" and text.startswith("# HELP ", i)):
                return
            i = _next_in_group(text, i, name)


def _first(text: str, name: str, pos: int) -> int:
    """Where the first line from ``pos`` (0, or a line's end) that starts with ``name`` has it; -1: none.

    One search, as an exporter writes lines: from their metric name.  A page that starts with blanks is
    indented (written by hand or a template, never by an exporter): its lines may start with blanks."""
    if text[:1] in (" ", "\t"):
        i = text.find(name, pos)
        while i != -1 and text[text.rfind("\n", 0, i) + 1 : i].strip(" \t"):
            i = text.find(name, i + len(name))  # in a comment (``# HELP name``), or inside another name
        return i
    if pos == 0 and text.startswith(name):
        return 0
    return text.find("\n" + name, pos) + 1 or -1


def _next_in_group(text: str, pos: int, name: str) -> int:
    """Where the line from ``pos`` that goes on the group of ``name`` has it, past blank and comment lines; -1
    when the next sample line is another metric's or its # HELP / # TYPE comes (the group ended)."""
    size = len(text)
    while pos < size:
        c = text[pos]
        if c == "#":
            if text.startswith("# HELP ", pos) or text.startswith("# TYPE ", pos):
                return -1
        elif c == " " or c == "\t":
            s = pos + 1
            while s < size and text[s] in " \t":
                s += 1
            if text.startswith(name, s):
                return s
            if s < size and text[s] not in "#\r\n":
                return -1
        elif c != "\n" and c != "\r":
            return -1
        pos = text.find("\n", pos) + 1
        if pos == 0:
            return -1
        if text.startswith(name, pos):
            return pos
    return -1


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

    The pairs are walked in order, values unescaped as the exposition format escapes them (``\\\\``,
    ``\\"``, ``\\n``): a name is matched whole (``block_size`` is not ``hash_block_size``; vLLM's
    cache_config_info has both), and never inside another label's value.
    """
    i, n = 0, len(labels)
    while i < n:
        eq = labels.find('="', i)
        if eq == -1:
            return None
        name = labels[i:eq].strip(" ,{")
        j = labels.find('"', eq + 2)
        if j == -1:
            return None  # an unterminated value
        if labels.find("\\", eq + 2, j) == -1:  # no escape: the value is the slice (nearly every page)
            if name == label:
                return labels[eq + 2 : j]
            i = j + 1
            continue
        j, out = eq + 2, []
        while j < n and labels[j] != '"':
            if labels[j] == "\\" and j + 1 < n:
                j += 1
                out.append("\n" if labels[j] == "n" else labels[j])
            else:
                out.append(labels[j])
            j += 1
        if j >= n:
            return None  # an unterminated value
        if name == label:
            return "".join(out)
        i = j + 1
    return None


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


def read_per_label(text: str, name: str, label: str | None) -> dict[str, float]:
    """``{label value: mean of its samples}`` of one family (a sample without the label, or ``label`` None: "").

    One figure per value of ``label``, however many series repeat it (they differ in other labels)."""
    return _means(read_series(text, name), label)


def read_total(text: str, name: str, label: str | None) -> float | None:
    """The sum over the values of ``label`` of each one's mean sample (:func:`read_per_label` added up); None
    when the family has no sample.  A family of one series is its value (no label read)."""
    series = [(labels, v) for labels, rest in _lines_of(text, name) if (v := _value(rest)) is not None]
    if len(series) < 2:
        return series[0][1] if series else None
    return sum(_means(series, label).values())


def _means(series: Iterable[tuple[str, float]], label: str | None) -> dict[str, float]:
    out: dict[str, float] = {}
    repeats: dict[str, int] = {}
    for labels, v in series:
        key = (label_value(labels, label) if label else None) or ""
        if key in out:
            out[key] += v
            repeats[key] = repeats.get(key, 1) + 1
        else:
            out[key] = v
    for key, n in repeats.items():
        out[key] /= n
    return out
