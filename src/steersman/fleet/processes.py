"""Engine processes steersman starts itself: ``llama-server`` replicas on 127.0.0.1.

:class:`LlamaServerFleet` starts N ``llama-server`` processes on free loopback
ports (parallel slots, ``--metrics``, ``/slots``, ``--swa-full`` so Gemma 3 can
reuse prompt prefixes, ``--cache-reuse``, ``--jinja`` with Gemma 3's chat template
shipped beside this module (tools included), ``--no-repack`` to stay off AMX, see ``LlamaCppSettings``), waits for each ``/health``, hands back
fleet-file endpoint entries, and stops them (SIGTERM, SIGKILL after a grace).
Each child also gets ``PR_SET_PDEATHSIG`` (Linux): if steersman itself is
killed with SIGKILL the kernel stops the engines, so no orphans are left.

The binary and the GGUF are found in the cache ``scripts/build-llama-server.sh``
fills (``$STEERSMAN_CACHE``, else ``$XDG_CACHE_HOME/steersman``, else
``~/.cache/steersman``), or at ``$STEERSMAN_LLAMA_SERVER`` / ``$STEERSMAN_GGUF``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steersman.clock import Clock, WallClock
from steersman.config import DEFAULTS, LlamaCppSettings

__all__ = ["DIE_WITH_PARENT", "OWN_SESSION", "EngineStartError", "EngineProcess", "LlamaServerFleet", "cache_dir", "chat_template_path", "find_llama_server",
           "find_gguf", "free_port"]

_PR_SET_PDEATHSIG = 1
_log = logging.getLogger("steersman.engines")
_BUILD_HINT = "build it with `make llama` (scripts/build-llama-server.sh; ~15 min once per machine)"


#: llama.cpp's boolean environment values (common/arg.cpp ``is_truthy`` / ``is_falsey``)
_ENV_BOOL = {"1": True, "true": True, "on": True, "enabled": True, "0": False, "false": False, "off": False,
             "disabled": False}


class EngineStartError(RuntimeError):
    pass


def cache_dir() -> Path:
    if os.environ.get("STEERSMAN_CACHE"):
        return Path(os.environ["STEERSMAN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "steersman"


def find_llama_server(settings: LlamaCppSettings = DEFAULTS.llamacpp) -> Path | None:
    """``$STEERSMAN_LLAMA_SERVER``, the build cache, or ``llama-server`` on PATH; None when absent."""
    env = os.environ.get("STEERSMAN_LLAMA_SERVER")
    if env:
        return Path(env) if os.access(env, os.X_OK) else None
    cached = cache_dir() / "llama.cpp" / settings.version / "bin" / "llama-server"
    if os.access(cached, os.X_OK):
        return cached
    on_path = shutil.which("llama-server")
    return Path(on_path) if on_path else None


def find_gguf(settings: LlamaCppSettings = DEFAULTS.llamacpp) -> Path | None:
    env = os.environ.get("STEERSMAN_GGUF")
    p = Path(env) if env else cache_dir() / "models" / settings.gguf_file
    return p if p.is_file() and p.stat().st_size > 0 else None


def chat_template_path(settings: LlamaCppSettings = DEFAULTS.llamacpp) -> Path:
    """The ``--chat-template-file`` of ``settings.chat_template``: a template shipped in ``steersman.fleet`` by that
    name, else the path as given (llama-server reports a path it cannot read when it starts)."""
    given = Path(settings.chat_template)
    shipped = Path(__file__).parent / given
    return shipped if given.name == settings.chat_template and shipped.is_file() else given


_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=4096)  # ports free_port() gave, newest last
_HANDED_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, and one this process has not been given by an earlier call (among the last
    4,096): a port is given before its server binds it, and the kernel can give one closed port again at once.  Seen
    in the chaos soak: two of four engine-sims were handed the same port, so "replicas" e0 and e2 were one process."""
    with _HANDED_LOCK:
        for _ in range(256):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _HANDED_OUT:
                _HANDED_OUT.append(port)
                return port
    raise OSError(f"no free port on {host} that was not handed out already")


try:  # loaded here, not in the child: no dlopen between fork and exec
    _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:  # pragma: no cover
    _LIBC = None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != _spawner[0]:  # the parent died between the fork and the prctl: nothing would signal us
            os._exit(1)


def _remember_spawner() -> None:
    _spawner[0] = os.getpid()


# the process about to fork, set in it before every fork that runs a preexec_fn (CPython's and uvloop's call the fork
# hooks for those): the child's copy names its parent
_spawner = [os.getpid()]
os.register_at_fork(before=_remember_spawner)

#: the ``preexec_fn`` of every engine child steersman starts (llama-server, engine-sim): killed when the thread that
#: started it ends, i.e. with steersman (None where there is no prctl)
DIE_WITH_PARENT = _die_with_parent if _LIBC is not None else None

#: where the children die with steersman (DIE_WITH_PARENT), they run in their own session, so that a terminal's Ctrl-C
#: (sent to its foreground process group) reaches steersman alone, which drains the streams in flight through them
#: before stopping them; elsewhere they stay in steersman's group, where the terminal's signals reach them too
OWN_SESSION = DIE_WITH_PARENT is not None


@dataclass(slots=True)
class EngineProcess:
    name: str
    host: str
    port: int
    proc: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


async def _http_status(host: str, port: int, path: str, timeout: float) -> int | None:
    """Status code of ``GET path`` (None when the server does not answer)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        line = await asyncio.wait_for(reader.readline(), timeout)
        parts = line.split()
        return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None
    except (OSError, TimeoutError, ValueError):
        return None
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


class LlamaServerFleet:
    """N ``llama-server`` replicas of one GGUF, started and stopped together."""

    def __init__(
        self,
        count: int,
        settings: LlamaCppSettings = DEFAULTS.llamacpp,
        binary: Path | None = None,
        model: Path | None = None,
        host: str = "127.0.0.1",
        extra_args: tuple[str, ...] = (),
        clock: Clock | None = None,
        name_prefix: str = "llamacpp",
    ) -> None:
        if count < 1:
            raise ValueError("count must be >= 1")
        self.count = count
        self.settings = settings
        self.binary = binary or find_llama_server(settings)
        self.model = model or find_gguf(settings)
        self.host = host
        self.extra_args = tuple(extra_args)
        self.clock = clock or WallClock()
        self.name_prefix = name_prefix
        self.procs: list[EngineProcess] = []
        self._logdir: Path | None = None

    def command(self, port: int) -> list[str]:
        s = self.settings
        return [
            str(self.binary), "-m", str(self.model), "--host", self.host, "--port", str(port),
            "--alias", s.model_name, "-np", str(s.parallel), "-c", str(s.ctx_size), "-t", str(s.threads),
            "--metrics", "--slots", "--swa-full", "--jinja", "--chat-template-file", str(chat_template_path(s)),
            "--cache-reuse", str(s.cache_reuse), *(() if s.repack else ("--no-repack",)), *self.extra_args,
        ]

    def _spawn(self, i: int) -> EngineProcess:
        assert self._logdir is not None
        port = free_port(self.host)
        name = f"{self.name_prefix}-{i}"
        log_path = self._logdir / f"{name}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                self.command(port), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=DIE_WITH_PARENT, start_new_session=OWN_SESSION,
            )
        return EngineProcess(name, self.host, port, proc, log_path)

    async def start(self) -> list[dict[str, Any]]:
        """Start every replica and wait until all answer ``/health`` 200; returns fleet endpoints."""
        if self.binary is None:
            raise EngineStartError(f"llama-server not found (cache {cache_dir()}, $STEERSMAN_LLAMA_SERVER, PATH): {_BUILD_HINT}")
        if self.model is None:
            raise EngineStartError(f"GGUF {self.settings.gguf_file} not found under {cache_dir() / 'models'} or $STEERSMAN_GGUF: {_BUILD_HINT}")
        self._logdir = Path(tempfile.mkdtemp(prefix="steersman-llamacpp-"))
        try:
            self.procs = []
            for i in range(self.count):
                self.procs.append(self._spawn(i))  # one at a time: a failed spawn leaves the others stoppable
            await asyncio.gather(*(self._wait_healthy(p) for p in self.procs))
        except BaseException:
            await self.stop()
            raise
        return self.endpoints()

    async def _wait_healthy(self, p: EngineProcess) -> None:
        deadline = self.clock.now() + self.settings.start_timeout_s
        while self.clock.now() < deadline:
            if not p.alive():
                raise EngineStartError(f"{p.name} exited with {p.proc.returncode} while starting:\n{p.log_tail()}")
            if await _http_status(p.host, p.port, "/health", 2.0) == 200:
                return
            await self.clock.sleep(0.1)
        raise EngineStartError(f"{p.name} not healthy after {self.settings.start_timeout_s} s:\n{p.log_tail()}")

    @property
    def kv_unified(self) -> bool:
        """Whether the replicas' slots share one KV pool: ``-np`` is given, so only ``-kvu`` makes them, in the extra
        arguments or else in ``LLAMA_ARG_KV_UNIFIED`` (the environment the llama-servers inherit; llama.cpp reads a
        flag's variable when the flag is not given, its values ``1`` / ``true`` / ``on`` / ``enabled`` and ``0`` /
        ``false`` / ``off`` / ``disabled``); the last of ``-kvu`` / ``-no-kvu`` wins, as llama.cpp reads them."""
        unified = _ENV_BOOL.get(os.environ.get("LLAMA_ARG_KV_UNIFIED", ""), False)
        for arg in self.extra_args:
            if arg in ("-kvu", "--kv-unified"):
                unified = True
            elif arg in ("-no-kvu", "--no-kv-unified"):
                unified = False
        return unified

    def endpoints(self) -> list[dict[str, Any]]:
        return [
            {"name": p.name, "url": p.url, "engine": "llamacpp", "models": [self.settings.model_name], "gpu": None,
             "kv_unified": self.kv_unified}
            for p in self.procs
        ]

    async def watch(self, every_s: float = 1.0) -> None:
        """Reap a replica that exits while the gateway runs and say so, once (a llama.cpp audit: a killed
        llama-server stayed a zombie, unnamed, until steersman stopped).  The gateway takes it out of rotation on
        its own (failed connections, failed scrapes); steersman does not restart it.  Runs until cancelled."""
        told: set[int] = set()
        while True:
            for i, p in enumerate(self.procs):
                if i not in told and not p.alive():  # poll() reaps it
                    told.add(i)
                    _log.warning("llama-server %s (pid %d) exited with code %s; it is not restarted. Its log's end:\n%s",
                                 p.name, p.pid, p.proc.returncode, p.log_tail(800))
            await self.clock.sleep(every_s)

    def kill(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one replica (fault injection in tests)."""
        p = self.procs[index]
        if p.alive():
            p.proc.send_signal(sig)

    async def stop(self) -> None:
        """SIGTERM every replica, SIGKILL those still running after the grace; reap them all."""
        for p in self.procs:
            if p.alive():
                with contextlib.suppress(ProcessLookupError):
                    p.proc.terminate()
        deadline = self.clock.now() + self.settings.stop_grace_s
        while any(p.alive() for p in self.procs) and self.clock.now() < deadline:
            await self.clock.sleep(0.05)
        for p in self.procs:
            if p.alive():
                with contextlib.suppress(ProcessLookupError):
                    p.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.proc.wait(timeout=5)
        if self._logdir is not None:
            shutil.rmtree(self._logdir, ignore_errors=True)  # the engines' logs (read into errors already)
            self._logdir = None

    def stop_now(self) -> None:
        """Synchronous last resort (atexit, signal handlers): SIGKILL everything still running."""
        for p in self.procs:
            if p.alive():
                with contextlib.suppress(ProcessLookupError):
                    p.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.proc.wait(timeout=5)
