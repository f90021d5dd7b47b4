"""What one load run records: per-request :class:`Record`, :class:`RunResult` and its summary, percentiles."""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass, field


@dataclass(slots=True)
class Record:
    start_ns: int  # perf_counter_ns when the request was written
    ttft_ns: int = -1  # -1: no content event seen
    e2e_ns: int = -1
    status: int = 0  # HTTP status; 0 = connection error / no response; -1 = timeout
    nbytes: int = 0  # response bytes on the wire (head + body)
    chunks: int = 0  # data events with content or after the first content (excl. [DONE])
    done: bool = False  # saw "data: [DONE]"
    gaps_ns: list = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.ttft_ns >= 0 and self.e2e_ns >= 0


def percentile(sorted_vals, q: float) -> float:
    """Nearest-rank-with-interpolation percentile of an already sorted sequence."""
    n = len(sorted_vals)
    if n == 0:
        return float("nan")
    if n == 1:
        return float(sorted_vals[0])
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return float(sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo))


def dist_ms(vals_ns) -> dict:
    """p50/p90/p99/mean/max in milliseconds of a list of nanosecond values."""
    v = sorted(vals_ns)
    if not v:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "mean": None, "max": None}
    return {
        "n": len(v),
        "p50": percentile(v, 50) / 1e6,
        "p90": percentile(v, 90) / 1e6,
        "p99": percentile(v, 99) / 1e6,
        "mean": sum(v) / len(v) / 1e6,
        "max": v[-1] / 1e6,
    }


@dataclass
class RunResult:
    records: list
    wall_s: float
    concurrency: int
    client_cpu_s: float  # CPU (user+sys) of this process during the run

    def summary(self) -> dict:
        recs = self.records
        ok = [r for r in recs if r.ok]
        gaps = [g for r in ok for g in r.gaps_ns]
        statuses: dict = {}
        for r in recs:
            k = str(r.status) if r.ok or r.status != 200 else "200-incomplete"
            statuses[k] = statuses.get(k, 0) + 1
        n = len(recs)
        return {
            "requests": n,
            "ok": len(ok),
            "errors": n - len(ok),
            "statuses": statuses,
            "first_error": next((r.error for r in recs if not r.ok and r.error), ""),
            "wall_s": self.wall_s,
            "rps": len(ok) / self.wall_s if self.wall_s > 0 else 0.0,
            "concurrency": self.concurrency,
            "ttft_ms": dist_ms([r.ttft_ns for r in ok]),
            "itl_ms": dist_ms(gaps),
            "e2e_ms": dist_ms([r.e2e_ns for r in ok]),
            "chunks_per_req": (sum(r.chunks for r in ok) / len(ok)) if ok else 0.0,
            "bytes_per_req": (sum(r.nbytes for r in ok) / len(ok)) if ok else 0.0,
            "client_cpu_s": self.client_cpu_s,
            "client_cpu_us_per_req": (self.client_cpu_s * 1e6 / n) if n else None,
            "client_cpu_util": self.client_cpu_s / self.wall_s if self.wall_s > 0 else 0.0,
        }


def cpu_self() -> float:
    """CPU (user+sys) seconds of this process."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def format_summary(s: dict) -> str:
    """A few lines of text for one `RunResult.summary()`."""
    def d(x):
        return f"p50 {x['p50']:.3f}  p90 {x['p90']:.3f}  p99 {x['p99']:.3f} ms" if x["n"] else "n/a"

    return (
        f"requests {s['requests']} ok {s['ok']} errors {s['errors']} {s['statuses']} in {s['wall_s']:.2f}s "
        f"= {s['rps']:.0f} req/s @ c={s['concurrency']}\n"
        f"  TTFT   {d(s['ttft_ms'])}\n  ITL    {d(s['itl_ms'])}\n  E2E    {d(s['e2e_ms'])}\n"
        f"  chunks/req {s['chunks_per_req']:.1f}  bytes/req {s['bytes_per_req']:.0f}  "
        f"client CPU {s['client_cpu_s']:.2f}s ({s['client_cpu_util'] * 100:.0f}% of a core, "
        f"{s['client_cpu_us_per_req'] or 0:.0f} us/req)"
        + (f"\n  first error: {s['first_error']}" if s["first_error"] else "")
    )

