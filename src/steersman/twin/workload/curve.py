"""A daily load curve: a 24-hour multiplier of a source's rate, for diurnal runs and capacity planning.

A source's rate at virtual time *t* is ``base_rate * curve.multiplier(t)``.  The
curve is periodic (``period_s``, a day by default; set e.g. 3600 to squeeze a
day into a simulated hour) and ``start_hour`` is the clock hour at ``t = 0``.

Arrivals follow the curve by time warping: a source generates its arrivals in
*operational time* ``u`` at the base rate (a Poisson process, or a trace's own
timestamps) and each is placed at ``t = Λ⁻¹(Λ(t0) + u)`` where
``Λ(t) = ∫ multiplier``; that is exactly a non-homogeneous Poisson process when
the operational process is Poisson, and a trace keeps its burst structure
while its average rate follows the curve.

YAML (``curve:`` of a source, or a named entry of ``curves:``)::

    {hourly: [0.3, 0.25, ..., 0.4]}             # 24 multipliers, one per clock hour
    {trough: 0.2, peak: 1.0, peak_hour: 14}      # sinusoid, trough 12 h from the peak
    # both take: period_s (86400), start_hour (0), and hourly takes interpolate (true):
    # linear between hour midpoints, else a step per hour
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["DailyCurve", "parse_curve", "CurveError", "hourly_offered_load"]

_GRID = 24 * 60  # knots of a sinusoid per period (one a minute for a day)


class CurveError(ValueError):
    pass


class DailyCurve:
    """Periodic, piecewise-linear rate multiplier with its integral and that integral's inverse (vectorised)."""

    __slots__ = ("period_s", "start_hour", "_t", "_m", "_cum", "_per", "desc")

    def __init__(self, hours: Sequence[float], values: Sequence[float], period_s: float = 86400.0,
                 start_hour: float = 0.0, desc: str = "curve") -> None:
        """Knots ``(clock hour, multiplier)`` from 0 to 24 (non-decreasing hours; a repeated hour is a step)."""
        h = np.asarray(hours, dtype=float)
        m = np.asarray(values, dtype=float)
        if (h.ndim != 1 or h.shape != m.shape or h.size < 2 or h[0] != 0.0 or h[-1] != 24.0
                or np.any(np.diff(h) < 0)):
            raise CurveError("curve knots must run from hour 0 to hour 24 in order")
        if not np.all(np.isfinite(m)) or np.any(m < 0):
            raise CurveError("a curve needs finite multipliers >= 0")
        if not m.max() > 0:
            raise CurveError("a curve must be > 0 somewhere")
        if not (math.isfinite(period_s) and period_s > 0):
            raise CurveError(f"period_s must be > 0, got {period_s!r}")
        self.period_s = float(period_s)
        self.start_hour = float(start_hour) % 24.0
        self.desc = desc
        # rotate so that virtual time 0 is clock start_hour: the window [s, s + 24) of the periodic curve
        s = self.start_hour
        h2 = np.concatenate((h, h + 24.0))  # hour 24 twice: a step from the day's end to its start
        m2 = np.concatenate((m, m))
        right = int(np.searchsorted(h2, s, "right"))  # first knot after s
        left = int(np.searchsorted(h2, s + 24.0, "left"))  # first knot at or after s + 24
        m_s = float(m2[right - 1]) if h2[right - 1] == s else float(np.interp(s, h2, m2))  # value just after s
        m_e = float(m2[left]) if h2[left] == s + 24.0 else float(np.interp(s + 24.0, h2, m2))  # value just before
        hh = np.concatenate(([s], h2[right:left], [s + 24.0])) - s
        mm = np.concatenate(([m_s], m2[right:left], [m_e]))
        self._t = hh * (self.period_s / 24.0)
        self._m = mm
        self._cum = np.concatenate(([0.0], np.cumsum(np.diff(self._t) * (mm[1:] + mm[:-1]) / 2)))
        self._per = float(self._cum[-1])  # integral over one period

    # ----- constructors
    @classmethod
    def hourly(cls, values: Sequence[float], *, interpolate: bool = True, period_s: float = 86400.0,
               start_hour: float = 0.0) -> DailyCurve:
        """24 multipliers, one per clock hour: linear between hour midpoints (wrapping), or steps."""
        v = np.asarray(values, dtype=float)
        if v.shape != (24,):
            raise CurveError(f"hourly needs 24 values, got {len(values)}")
        if interpolate:  # linear between hour midpoints, wrapping around midnight
            hours = np.concatenate(([0.0], np.arange(24) + 0.5, [24.0]))
            edge = (v[0] + v[-1]) / 2
            m = np.concatenate(([edge], v, [edge]))
        else:  # a step per hour
            hours = np.repeat(np.arange(25.0), 2)[1:-1]
            m = np.repeat(v, 2)
        return cls(hours, m, period_s, start_hour, f"hourly{list(np.round(v, 3))}")

    @classmethod
    def sinusoid(cls, trough: float = 0.25, peak: float = 1.0, peak_hour: float = 14.0, *,
                 period_s: float = 86400.0, start_hour: float = 0.0) -> DailyCurve:
        """``trough`` at ``peak_hour - 12``, ``peak`` at ``peak_hour``, a cosine in between."""
        if not (0 <= trough <= peak) or peak <= 0:
            raise CurveError(f"a sinusoid needs 0 <= trough <= peak and peak > 0, got trough {trough}, peak {peak}")
        h = np.linspace(0.0, 24.0, _GRID + 1)
        m = trough + (peak - trough) * (1 + np.cos(2 * np.pi * (h - peak_hour) / 24.0)) / 2
        return cls(h, m, period_s, start_hour, f"sinusoid(trough={trough}, peak={peak}, peak_hour={peak_hour})")

    @classmethod
    def flat(cls, value: float = 1.0) -> DailyCurve:
        return cls([0.0, 24.0], [float(value)] * 2, desc=f"flat({value})")

    # ----- evaluation
    def multiplier(self, t):
        """Multiplier at virtual time(s) ``t``."""
        r = np.mod(t, self.period_s)
        out = np.interp(r, self._t, self._m)
        return float(out) if np.ndim(out) == 0 else out

    def _in_period_cum(self, r: np.ndarray) -> np.ndarray:
        """``Λ`` within one period, exact for the piecewise-linear multiplier (quadratic between knots)."""
        t, m = self._t, self._m
        i = np.clip(np.searchsorted(t, r, "right") - 1, 0, t.size - 2)
        return self._cum[i] + (r - t[i]) * (m[i] + np.interp(r, t, m)) / 2

    def cumulative(self, t):
        """``Λ(t) = ∫_0^t multiplier`` (seconds × multiplier), for ``t >= 0``."""
        t = np.asarray(t, dtype=float)
        k = np.floor(t / self.period_s)
        out = k * self._per + self._in_period_cum(t - k * self.period_s)
        return float(out) if out.ndim == 0 else out

    def warp(self, u):
        """Inverse of :meth:`cumulative`: the virtual time at which ``Λ`` reaches ``u`` (skips zero-rate spans)."""
        u = np.asarray(u, dtype=float)
        k = np.floor(u / self._per)
        r = u - k * self._per
        t, m, cum = self._t, self._m, self._cum
        i = np.clip(np.searchsorted(cum, r, "right") - 1, 0, t.size - 2)
        dt = t[i + 1] - t[i]
        slope = np.divide(m[i + 1] - m[i], dt, out=np.zeros_like(dt), where=dt > 0)
        need = r - cum[i]
        # m_i x + slope x^2 / 2 = need, solved in the form that is stable when slope ~ 0
        den = m[i] + np.sqrt(np.maximum(m[i] ** 2 + 2 * slope * need, 0.0))
        x = np.divide(2 * need, den, out=np.zeros_like(need), where=den > 0)
        out = k * self.period_s + t[i] + np.minimum(x, dt)
        return float(out) if out.ndim == 0 else out

    def mean(self, t0: float | None = None, t1: float | None = None) -> float:
        """Average multiplier over ``[t0, t1)`` (default: a whole period)."""
        if t0 is None or t1 is None:
            return self._per / self.period_s
        if t1 <= t0:
            return float(self.multiplier(t0))
        return (self.cumulative(t1) - self.cumulative(t0)) / (t1 - t0)

    def hour_means(self) -> list[float]:
        """Average multiplier over each clock hour 0..23 (independent of ``start_hour``)."""
        hour = self.period_s / 24
        shift = (-self.start_hour % 24) * hour  # virtual time at which the clock reads 00:00
        return [self.mean(shift + h * hour, shift + (h + 1) * hour) for h in range(24)]

    def __repr__(self) -> str:
        return f"DailyCurve({self.desc}, period_s={self.period_s:g}, start_hour={self.start_hour:g})"


_HOURLY_KEYS = {"hourly", "interpolate", "period_s", "start_hour"}
_SIN_KEYS = {"trough", "peak", "peak_hour", "period_s", "start_hour"}


def parse_curve(v: object) -> DailyCurve:
    """A :class:`DailyCurve` from its YAML mapping (see the module docstring); raises :class:`CurveError`."""
    if isinstance(v, DailyCurve):
        return v
    if isinstance(v, list):
        v = {"hourly": v}
    if not isinstance(v, Mapping):
        raise CurveError(f"expected a mapping with 'hourly' or 'trough'/'peak', got {v!r}")
    for k in ("period_s", "start_hour", "trough", "peak", "peak_hour"):
        x = v.get(k)
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)):
            raise CurveError(f"{k} must be a finite number, got {x!r}")
    common = {"period_s": float(v.get("period_s", 86400.0)), "start_hour": float(v.get("start_hour", 0.0))}
    if "hourly" in v:
        if unknown := sorted(map(str, set(v) - _HOURLY_KEYS)):
            raise CurveError(f"unknown key(s) {unknown} for an hourly curve; known: {sorted(_HOURLY_KEYS)}")
        hv = v["hourly"]
        if (not isinstance(hv, list) or len(hv) != 24
                or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= 0 for x in hv)):
            raise CurveError("hourly must be a list of 24 numbers >= 0")
        interp = v.get("interpolate", True)
        if not isinstance(interp, bool):
            raise CurveError(f"interpolate must be true or false, got {interp!r}")
        return DailyCurve.hourly(hv, interpolate=interp, **common)
    if unknown := sorted(map(str, set(v) - _SIN_KEYS)):
        raise CurveError(f"unknown key(s) {unknown}; a curve is {{hourly: [24 values]}} or {{trough, peak, peak_hour}}")
    return DailyCurve.sinusoid(float(v.get("trough", 0.25)), float(v.get("peak", 1.0)), float(v.get("peak_hour", 14.0)),
                               **common)


def hourly_offered_load(workload, hours: int = 24, hour_s: float = 3600.0, start_s: float = 0.0,
                        latency_s: float = 0.0) -> list:
    """The workload's expected load in each hour ``[start_s + h*hour_s, start_s + (h+1)*hour_s)``.

    For sizing a fleet per hour ("how many replicas at 14:00").  Agent load is
    attributed to the hour its tasks start in.
    """
    return [workload.offered_load(start_s + h * hour_s, start_s + (h + 1) * hour_s, latency_s=latency_s)
            for h in range(hours)]
