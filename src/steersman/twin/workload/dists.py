"""Distributions of token counts, call counts and gaps, drawn in numpy chunks.

Spec forms (YAML or Python values), see :func:`parse_dist`::

    300                                   # constant
    [10, 20]                              # uniform; integers inclusive when both ends are ints
    {dist: uniform, min: 0.5, max: 2.0}
    {dist: exponential, mean: 2.0}
    {dist: lognormal, mean: 300, cv: 1.0}         # or {dist: lognormal, median: 200, sigma: 0.8}
    {dist: loguniform, min: 200, max: 2000}
    {dist: normal, mean: 100, std: 20}
    {dist: choice, values: [1, 2, 8], weights: [0.5, 0.3, 0.2]}

Any form but a constant or ``[lo, hi]`` also takes ``min`` / ``max`` clamps
(uniform and loguniform use them as their range).  Integer quantities are
rounded to the nearest integer and then clamped to the quantity's own floor
(e.g. at least 1 output token).

Draws come from :func:`stream`: a generator that refills from numpy in chunks,
so one draw costs a ``next()`` (~50 ns), not a numpy call.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["Dist", "Const", "Uniform", "Exponential", "LogNormal", "LogUniform", "Normal", "Choice", "parse_dist",
           "stream", "as_ints", "DistError"]


class DistError(ValueError):
    """A distribution spec is invalid (the message says what is wrong; the caller prefixes the field)."""


class Dist:
    """A distribution of a non-negative quantity."""

    lo: float | None = None  # clamp
    hi: float | None = None

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = self._draw(rng, n)
        if self.lo is not None or self.hi is not None:
            x = np.clip(x, self.lo, self.hi)
        return x

    def _raw_mean(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def mean(self) -> float:
        """Mean of the (clamped, unrounded) distribution; Monte Carlo with a fixed seed when clamped."""
        if self.lo is None and self.hi is None:
            return self._raw_mean()
        return float(self.sample(np.random.default_rng(12345), 1 << 18).mean())

    def quantile_hi(self) -> float:
        """A value above practically every draw (the 99.99th percentile, or the upper bound)."""
        return float(np.quantile(self.sample(np.random.default_rng(54321), 1 << 16), 0.9999))

    @property
    def integral(self) -> bool:
        return False


@dataclass(frozen=True)
class Const(Dist):
    value: float

    def _draw(self, rng, n):
        return np.full(n, self.value, dtype=float)

    def _raw_mean(self):
        return float(self.value)

    def quantile_hi(self):
        return float(self.value)

    @property
    def integral(self):
        return float(self.value).is_integer()


@dataclass(frozen=True)
class Uniform(Dist):
    min: float
    max: float
    integer: bool = False  # integers min..max inclusive

    def _draw(self, rng, n):
        if self.integer:
            return rng.integers(int(self.min), int(self.max) + 1, n).astype(float)
        return rng.uniform(self.min, self.max, n)

    def _raw_mean(self):
        return (self.min + self.max) / 2

    def quantile_hi(self):
        return float(self.max)

    @property
    def integral(self):
        return self.integer


@dataclass(frozen=True)
class Exponential(Dist):
    mean_: float
    lo: float | None = None
    hi: float | None = None

    def _draw(self, rng, n):
        return rng.exponential(self.mean_, n)

    def _raw_mean(self):
        return self.mean_


@dataclass(frozen=True)
class LogNormal(Dist):
    mu: float
    sigma: float
    lo: float | None = None
    hi: float | None = None

    @classmethod
    def from_mean_cv(cls, mean: float, cv: float, lo=None, hi=None) -> LogNormal:
        s2 = math.log1p(cv * cv)
        return cls(math.log(mean) - s2 / 2, math.sqrt(s2), lo, hi)

    def _draw(self, rng, n):
        return rng.lognormal(self.mu, self.sigma, n)

    def _raw_mean(self):
        return math.exp(self.mu + self.sigma**2 / 2)


@dataclass(frozen=True)
class LogUniform(Dist):
    min: float
    max: float

    def _draw(self, rng, n):
        return np.exp(rng.uniform(math.log(self.min), math.log(self.max), n))

    def _raw_mean(self):
        if self.max == self.min:
            return float(self.min)
        return (self.max - self.min) / math.log(self.max / self.min)

    def quantile_hi(self):
        return float(self.max)


@dataclass(frozen=True)
class Normal(Dist):
    mean_: float
    std: float
    lo: float | None = 0.0
    hi: float | None = None

    def _draw(self, rng, n):
        return rng.normal(self.mean_, self.std, n)

    def _raw_mean(self):
        return self.mean_


@dataclass(frozen=True)
class Choice(Dist):
    values: tuple[float, ...]
    weights: tuple[float, ...]

    def _draw(self, rng, n):
        return np.asarray(self.values, dtype=float)[rng.choice(len(self.values), n, p=self.weights)]

    def _raw_mean(self):
        return float(np.dot(self.values, self.weights))

    def quantile_hi(self):
        return float(max(self.values))

    @property
    def integral(self):
        return all(float(v).is_integer() for v in self.values)


def _num(v, what: str, *, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise DistError(f"{what} must be a finite number, got {v!r}")
    if v < 0 or (positive and v == 0):
        raise DistError(f"{what} must be {'> 0' if positive else '>= 0'}, got {v!r}")
    return float(v)


_KINDS = {
    "constant": ({"value"}, set()),
    "uniform": ({"min", "max"}, set()),
    "exponential": ({"mean"}, {"min", "max"}),
    "lognormal": (set(), {"mean", "cv", "median", "sigma", "min", "max"}),
    "loguniform": ({"min", "max"}, set()),
    "normal": ({"mean", "std"}, {"min", "max"}),
    "choice": ({"values"}, {"weights"}),
}


def parse_dist(v: object) -> Dist:
    """A :class:`Dist` from a spec value (see the module docstring); raises :class:`DistError`."""
    if isinstance(v, Dist):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return Const(_num(v, "value"))
    if isinstance(v, (list, tuple)):
        if len(v) != 2:
            raise DistError(f"a range must be [min, max], got {list(v)!r}")
        lo, hi = _num(v[0], "min"), _num(v[1], "max")
        if hi < lo:
            raise DistError(f"range [min, max] needs min <= max, got {list(v)!r}")
        integer = all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        return Uniform(lo, hi, integer)
    if not isinstance(v, Mapping):
        raise DistError(f"expected a number, [min, max] or a mapping with 'dist', got {v!r}")
    kind = v.get("dist")
    if kind not in _KINDS:
        raise DistError(f"'dist' must be one of {sorted(_KINDS)}, got {kind!r}")
    need, opt = _KINDS[kind]
    keys = set(v) - {"dist"}
    if unknown := sorted(map(str, keys - need - opt)):
        raise DistError(f"{kind}: unknown key(s) {unknown}; known: {sorted(need | opt)}")
    if missing := sorted(need - keys):
        raise DistError(f"{kind}: missing {missing}")
    lo = _num(v["min"], "min") if "min" in v and kind not in ("uniform", "loguniform") else None
    hi = _num(v["max"], "max") if "max" in v and kind not in ("uniform", "loguniform") else None
    if lo is not None and hi is not None and hi < lo:
        raise DistError(f"{kind}: min must be <= max")
    if kind == "constant":
        return Const(_num(v["value"], "value"))
    if kind in ("uniform", "loguniform"):
        a, b = _num(v["min"], "min", positive=kind == "loguniform"), _num(v["max"], "max")
        if b < a:
            raise DistError(f"{kind}: min must be <= max")
        if kind == "uniform":
            return Uniform(a, b, isinstance(v["min"], int) and isinstance(v["max"], int))
        return LogUniform(a, b)
    if kind == "exponential":
        return Exponential(_num(v["mean"], "mean", positive=True), lo, hi)
    if kind == "lognormal":
        if "mean" in v or "cv" in v:
            if "median" in v or "sigma" in v or "mean" not in v:
                raise DistError("lognormal: give {mean, cv} (cv defaults to 1) or {median, sigma}")
            return LogNormal.from_mean_cv(_num(v["mean"], "mean", positive=True), _num(v.get("cv", 1.0), "cv", positive=True), lo, hi)
        if "median" not in v or "sigma" not in v:
            raise DistError("lognormal: give {mean, cv} (cv defaults to 1) or {median, sigma}")
        return LogNormal(math.log(_num(v["median"], "median", positive=True)), _num(v["sigma"], "sigma"), lo, hi)
    if kind == "normal":
        return Normal(_num(v["mean"], "mean"), _num(v["std"], "std"), 0.0 if lo is None else lo, hi)
    values = v["values"]
    if not isinstance(values, list) or not values:
        raise DistError("choice: values must be a non-empty list of numbers")
    vals = tuple(_num(x, "choice value") for x in values)
    w = v.get("weights")
    if w is None:
        weights = tuple(1.0 / len(vals) for _ in vals)
    else:
        if not isinstance(w, list) or len(w) != len(vals):
            raise DistError("choice: weights must be a list as long as values")
        ws = [_num(x, "weight") for x in w]
        if sum(ws) <= 0:
            raise DistError("choice: weights must not all be 0")
        weights = tuple(x / sum(ws) for x in ws)
    return Choice(vals, weights)


def as_ints(x: np.ndarray, floor: int = 0, ceil: int | None = None) -> np.ndarray:
    """Round to integers and clamp to ``[floor, ceil]`` (int64)."""
    return np.clip(np.rint(x), floor, ceil).astype(np.int64)


def stream(dist: Dist, rng: np.random.Generator, *, integer: bool = False, floor: int = 0,
           ceil: int | None = None, chunk: int = 4096) -> Iterator:
    """Endless draws of ``dist`` as Python numbers (ints rounded and clamped when ``integer``)."""
    if isinstance(dist, Const):  # no numpy at all
        v = dist.value
        if integer:
            v = int(min(max(round(v), floor), ceil if ceil is not None else math.inf))
        while True:
            yield v
    while True:
        x = dist.sample(rng, chunk)
        yield from (as_ints(x, floor, ceil) if integer else x).tolist()
