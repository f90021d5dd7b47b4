"""Process helpers for benchmarks: start pinned servers, wait for readiness,
account their CPU time, and always clean them up.

Every process is started in its own session (so a terminal Ctrl-C reaches
only the harness, which then stops them in order), with
``PR_SET_PDEATHSIG=SIGTERM`` (so they die if the harness is SIGKILLed), and
optionally pinned to a set of CPUs *before* exec (so runtimes that size
their thread pools from the affinity mask, like tokio, see only those CPUs).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1

try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover
    _libc = None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _preexec(cpus):
    def fn():
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return fn


# --------------------------------------------------------------------------- CPU accounting


def _tasks_cpu_ns(pid: int) -> int:
    """On-CPU time of all live threads of `pid` in ns (schedstat), or ticks-based fallback."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    ok = False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
                ok = True
        except (OSError, ValueError, IndexError):
            pass
    if ok:
        return total
    try:  # fallback: utime+stime in clock ticks (includes exited threads)
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
        tck = os.sysconf("SC_CLK_TCK")
        return (int(rest[11]) + int(rest[12])) * 1_000_000_000 // tck
    except (OSError, ValueError, IndexError):
        return 0


def descendants(pid: int) -> list[int]:
    """pid and all its live descendants (scans /proc)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, ()))
    return out


def tree_cpu_ns(pid: int) -> int:
    return sum(_tasks_cpu_ns(p) for p in descendants(pid))


def self_cpu_ns() -> int:
    return time.process_time_ns()


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    name: str
    argv: list
    log_path: Path
    popen: subprocess.Popen | None = None
    role: str = "server"  # "engine" | "router" | ...
    env: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else -1

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, n: int = 20) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def cpu_ns(self) -> int:
        return tree_cpu_ns(self.pid) if self.alive() else 0


class ProcessGroup:
    """Owns every process the benchmark starts; `stop_all()` is idempotent."""

    def __init__(self, log_dir: Path, cpus: set | None = None, role_cpus: dict | None = None):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.cpus = cpus
        self.role_cpus = role_cpus or {}  # role -> cores, overriding ``cpus`` for that role
        self.procs: list[Proc] = []

    def start(self, name: str, argv: list, *, role: str = "server", env: dict | None = None,
              cwd: str | None = None) -> Proc:
        log = self.log_dir / f"{name}.log"
        p = Proc(name, [str(a) for a in argv], log, role=role, env=env or {})
        full_env = dict(os.environ)
        full_env.update(p.env)
        with open(log, "wb") as f:
            p.popen = subprocess.Popen(
                p.argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env, cwd=cwd,
                start_new_session=True, preexec_fn=_preexec(self.role_cpus.get(role, self.cpus)),  # noqa: PLW1509 - the harness is single-threaded
            )
        self.procs.append(p)
        return p

    def stop(self, p: Proc, grace: float = 5.0) -> None:
        if p.popen is None:
            return
        if p.popen.poll() is None:
            try:
                os.killpg(p.popen.pid, signal.SIGTERM)  # its own session/group, started by us
            except ProcessLookupError:
                pass
            try:
                p.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.popen.wait(timeout=5)
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self) -> None:
        # signal all first, then wait, so shutdowns overlap
        for p in list(self.procs):
            if p.popen is not None and p.popen.poll() is None:
                try:
                    os.killpg(p.popen.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in list(self.procs):
            self.stop(p)


def http_get(url: str, timeout: float = 1.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read() if e.fp else b""
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, b""


def wait_http(p: Proc, url: str, timeout: float, *, want=lambda st, body: st == 200, interval: float = 0.05) -> float:
    """Poll `url` until `want(status, body)`; return seconds waited. Raises if `p` exits or on timeout."""
    t0 = time.monotonic()
    while True:
        if not p.alive():
            raise RuntimeError(f"{p.name} exited with {p.popen.returncode} before it was ready:\n{p.log_tail()}")
        st, body = http_get(url, timeout=1.0)
        if want(st, body):
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{p.name} not ready at {url} after {timeout:.0f}s (last status {st}):\n{p.log_tail()}")
        time.sleep(interval)


# --------------------------------------------------------------------------- other load on the machine


def all_procs_ticks() -> dict:
    """pid -> (utime+stime clock ticks, comm) for every process on the machine."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                raw = f.read()
            head, rest = raw.rsplit(b")", 1)
            comm = head.split(b"(", 1)[1].decode(errors="replace")
            f_ = rest.split()
            out[int(d)] = (int(f_[11]) + int(f_[12]), comm)
        except (OSError, ValueError, IndexError):
            continue
    return out


def foreign_cpu(before: dict, after: dict, ours: set, wall_s: float) -> dict:
    """CPU used by processes not in `ours` between two all_procs_ticks() snapshots."""
    tck = os.sysconf("SC_CLK_TCK")
    per = {}
    for pid, (t1, comm) in after.items():
        if pid in ours:
            continue
        d = t1 - before.get(pid, (0, comm))[0]
        if d > 0:
            per[f"{comm}[{pid}]"] = d / tck
    total = sum(per.values())
    top = sorted(per.items(), key=lambda kv: -kv[1])[:3]
    return {"cpu_s": total, "util": total / wall_s if wall_s > 0 else 0.0,
            "top": [{"proc": k, "util": v / wall_s if wall_s > 0 else 0.0} for k, v in top]}
