"""A chaos soak: the gateway over engine-sim processes while faults hit them at random; every answer checked.

Everything is a real process on 127.0.0.1: ``replicas`` engine-sim servers, one more engine-sim
that no fault touches (the reference), and ``steersman serve`` in front of the first ones.  For
``seconds``, ``concurrency`` clients with the official ``openai`` client send a seeded mix: chat
and text completions, streamed (with ``stream_options.include_usage``) or not, a few long shared
system prompts and short unique questions, 1-48 output tokens.  Meanwhile one fault at a time
hits a random replica through its ``/admin/faults`` (each kind in turn, so every kind appears; a hang
or a crash hits a replica that is generating, as it only tests something where there is work):

* ``errors``: 40% of its new requests answer 5xx, for 2 s;
* ``slow``: every step 5x slower, for 2 s;
* ``hang``: no progress, connections open, for 3 s (the gateway ejects it after 2 s without a first token);
* ``refuse``: connections refused for 2 s (the listener closed, the gateway's idle pooled ones too);
* ``die``: it crashes after 1-60 more streamed tokens (connections reset); the process is
  killed and started again on the same port 2 s later (empty caches, as a restarted engine).

The clients belong to three tenants (critical, standard, sheddable API keys), ask for an SLO class
each time, and one request in ten carries a whole-response deadline (50 ms, 0.5 s or 5 s); one
stream in twenty is abandoned by its client part-way.  With ``max_num_seqs`` small the fleet is
overloaded as well: requests queue in the gateway, and late or sheddable ones are refused.

Then the faults are cleared, and once the gateway reports every replica healthy, ``recovery``
more requests must all succeed.  The checks (:class:`Report`): engine-sim's text is a function of
the request, so every answer that succeeded is compared with the reference engine's answer to the
same request (text, finish reason, completion tokens): a stream continued on another replica
after its engine died must read as one uninterrupted answer.  Failures must be answers in the
OpenAI error format (a status, or an error event in the stream), none after part of a stream was
sent unless its deadline passed; the gateway's request count must equal the clients', and nothing
may remain in flight, at the gateway or on the engines (an abandoned stream is cancelled there).

    .venv/bin/python -m steersman.testing.chaos [--seconds 60] [--concurrency 24] [--seed 1]

Needs the ``openai`` package (the test extra).  Used by ``tests/faults/test_chaos.py`` and the
``chaos`` scenario of ``bench/faults/run.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from steersman.engines.promtext import read_labelled, read_samples
from steersman.fleet.processes import free_port

__all__ = ["Report", "run", "FAULTS"]

MODEL = "llama-3.1-8b"
#: the tenants of the soak's clients (each client worker one of them, in turn): (name, priority, API key)
TENANTS = (("acme", "critical", "chaos-key-acme"), ("web", "standard", "chaos-key-web"),
           ("free", "sheddable", "chaos-key-free"))
FAULTS = ("errors", "slow", "hang", "refuse", "die")
_SYSTEMS = tuple(" ".join(f"rule{k}-{j}" for j in range(200)) for k in range(5))
_WORDS = ("alpha", "beta", "gamma", "delta", "epsilon")
_ENGINE_BUSY = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting"}
_GENERATED = {"vllm:generation_tokens_total": "tokens"}
#: faults that test nothing on a replica without work (one the gateway ejected for 30 s after a hang gets none)
_NEED_WORK = ("hang", "die")


@dataclass
class Report:
    requests: int = 0  # sent during the soak (recovery requests not included)
    succeeded: int = 0
    checked: int = 0  # successes compared with the reference engine
    mismatches: list[str] = field(default_factory=list)
    failures: Counter = field(default_factory=Counter)  # (status or error kind, after partial output) -> count
    failure_messages: list[str] = field(default_factory=list)  # the first message of each kind of failure
    slowest_s: float = 0.0
    faults: Counter = field(default_factory=Counter)
    abandoned: int = 0  # streams the client closed part-way (on purpose)
    engines_busy_after: float = -1.0  # requests running or waiting on the engines once all is done (leaks: > 0)
    recovery_ok: int = 0
    recovery: int = 0
    gateway_requests: float = 0.0  # steersman:requests_total summed
    in_flight_after: float = -1.0
    retries: dict[str, float] = field(default_factory=dict)  # steersman:retries_total by outcome

    def summary(self) -> str:
        lines = [f"{self.requests} requests ({self.succeeded} succeeded, {self.abandoned} abandoned by their client "
                 f"part-way), faults {dict(self.faults)}",
                 f"checked {self.checked} answers against the reference engine: {len(self.mismatches)} differ",
                 f"failures (status, after partial output): {dict(self.failures)}",
                 f"slowest request {self.slowest_s:.1f} s; recovery {self.recovery_ok}/{self.recovery}",
                 f"gateway counted {self.gateway_requests:.0f} requests (clients sent {self.requests + self.recovery}); "
                 f"in flight after: {self.in_flight_after:g}; on the engines: {self.engines_busy_after:g}",
                 f"retry decisions: {self.retries}"]
        lines += [f"  differs: {m}" for m in self.mismatches[:5]] + [f"  failed: {m}" for m in self.failure_messages[:12]]
        return "\n".join(lines)


def _wait(url: str, timeout: float, ready=lambda r: r.status_code == 200) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if ready(httpx.get(url, timeout=1)):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready within {timeout:g} s")


def _request(rng: random.Random, i: int, plain: bool = False) -> dict:
    """One request of the mix; ``plain``: never abandoned, no SLO class or deadline (the recovery requests)."""
    user = f"question {i} " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 30)))
    req = {"stream": rng.random() < 0.85, "max_tokens": rng.randint(1, 48)}
    if not plain:
        if req["stream"] and req["max_tokens"] > 2 and rng.random() < 0.05:  # the client walks away mid-stream
            req["abandon_after"] = rng.randint(1, req["max_tokens"] // 2)
        headers = {"x-steersman-slo": rng.choice(("interactive", "standard", "batch"))}
        if rng.random() < 0.1:  # a whole-response deadline, some of them too short to meet
            headers["x-steersman-deadline-ms"] = str(rng.choice((50, 500, 5000)))
        req["headers"] = headers
    if rng.random() < 0.8:
        req["messages"] = [{"role": "system", "content": rng.choice(_SYSTEMS)}, {"role": "user", "content": user}]
    else:
        req["prompt"] = rng.choice(_SYSTEMS) + " " + user
    return req


async def _ask(client, req: dict) -> dict:
    """One request with the official client: its text, finish reason and completion tokens, or how it failed."""
    import openai

    chat = "messages" in req
    api = client.chat.completions if chat else client.completions
    kw = {"model": MODEL, "max_tokens": req["max_tokens"], "extra_headers": req.get("headers"),
          **({"messages": req["messages"]} if chat else {"prompt": req["prompt"]})}
    text: list[str] = []
    finish = usage = None
    t0 = time.monotonic()
    try:
        if req["stream"]:
            stream = await api.create(stream=True, stream_options={"include_usage": True}, **kw)
            async for ch in stream:
                if len(text) >= req.get("abandon_after", 1 << 30):
                    await stream.close()  # the connection drops: the gateway must cancel the engine's request
                    return {"ok": None, "kind": "abandoned", "s": time.monotonic() - t0}
                if ch.usage is not None:
                    usage = ch.usage.completion_tokens
                for c in ch.choices:
                    piece = c.delta.content if chat else c.text
                    if piece:
                        text.append(piece)
                    finish = c.finish_reason or finish
        else:
            r = await api.create(**kw)
            c = r.choices[0]
            text.append((c.message.content if chat else c.text) or "")
            finish, usage = c.finish_reason, r.usage.completion_tokens
    except openai.APIStatusError as e:
        return {"ok": False, "kind": e.status_code, "partial": bool(text), "msg": str(e)[:200], "s": time.monotonic() - t0}
    except openai.APIError as e:  # an error event in the stream (its deadline passed, ...), or the connection failed
        kind = "deadline" if "deadline" in str(e) else type(e).__name__
        return {"ok": False, "kind": kind, "partial": bool(text), "msg": str(e)[:200], "s": time.monotonic() - t0}
    return {"ok": True, "text": "".join(text), "finish": finish, "usage": usage, "s": time.monotonic() - t0}


class _Engines:
    """engine-sim processes on fixed ports, started again on the same port after a crash."""

    def __init__(self, n: int, speedup: float, log_dir: Path, max_num_seqs: int | None = None) -> None:
        self.speedup, self.log_dir, self.max_num_seqs = speedup, log_dir, max_num_seqs
        self.ports = [free_port() for _ in range(n)]
        self.procs: dict[int, subprocess.Popen] = {}
        self._logs: list = []

    def start(self, port: int) -> None:
        log = open(self.log_dir / f"engine-{port}.log", "ab")  # noqa: SIM115 (closed in stop())
        self._logs.append(log)
        self.procs[port] = subprocess.Popen(
            [sys.executable, "-m", "steersman", "engine-sim", "--gpu", "H100", "--model", MODEL, "--port", str(port),
             "--speedup", str(self.speedup),
             *(["--max-num-seqs", str(self.max_num_seqs)] if self.max_num_seqs else [])],
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)

    def restart(self, port: int) -> None:
        p = self.procs[port]
        if p.poll() is None:
            p.kill()
        p.wait()
        self.start(port)
        _wait(f"http://127.0.0.1:{port}/health", 60)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        for log in self._logs:
            log.close()


async def _chaos(engines: _Engines, rng: random.Random, until: float, report: Report,
                 faults: tuple[str, ...] = FAULTS) -> None:
    """One fault at a time on a random replica, each kind of ``faults`` in turn, until 3 s before the load stops."""
    async with httpx.AsyncClient(timeout=5) as ac:
        k = 0
        while time.monotonic() < until - 3:
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            act = faults[k % len(faults)]
            k += 1
            port = rng.choice(await _generating(ac, engines) if act in _NEED_WORK else engines.ports)
            report.faults[act] += 1
            try:
                await _inject(ac, engines, port, act, rng)
            except httpx.HTTPError as e:  # its admin endpoint went with the process: the fault is there anyway
                report.failure_messages.append(f"(fault {act} on {port}: {e!r})")


async def _generating(ac: httpx.AsyncClient, engines: _Engines, window: float = 0.2) -> list[int]:
    """The replicas whose engines generated tokens over ``window`` seconds (all of them if none did)."""
    async def tokens() -> dict[int, float]:
        out = {}
        for port in engines.ports:
            try:
                out[port] = read_samples((await ac.get(f"http://127.0.0.1:{port}/metrics")).text, _GENERATED)["tokens"]
            except (httpx.HTTPError, KeyError):  # down or restarting: not a candidate
                pass
        return out

    before = await tokens()
    await asyncio.sleep(window)
    after = await tokens()
    busy = [port for port, n in after.items() if n > before.get(port, n)]
    return busy or list(engines.ports)


async def _inject(ac: httpx.AsyncClient, engines: _Engines, port: int, act: str, rng: random.Random) -> None:
    """One fault on the replica at ``port``, for its duration, then cleared."""
    url = f"http://127.0.0.1:{port}/admin/faults"
    if act == "errors":
        await ac.post(url, json={"error_rate": 0.4, "error_status": rng.choice([500, 502, 503])})
        await asyncio.sleep(2)
    elif act == "slow":
        await ac.post(url, json={"slowdown": 5.0})
        await asyncio.sleep(2)
    elif act == "hang":
        await ac.post(url, json={"hang": True})
        await asyncio.sleep(3.0)  # past the 2 s stall floor (latency_floor_ttft_s): ejected, what waited there moves
    elif act == "refuse":  # the listener (its admin endpoint too) opens again by itself
        await ac.post(url, json={"refuse_for_s": 2.0})
        await asyncio.sleep(2.5)
        return
    else:
        await ac.post(url, json={"die_after_tokens": rng.randint(1, 60)})
        await asyncio.sleep(2)
        await asyncio.to_thread(engines.restart, port)
        return
    await ac.delete(url)


def _engines_busy(engines: _Engines, timeout: float = 10.0) -> float:
    """Requests still running or waiting on the engines, once they had ``timeout`` s to see cancellations."""
    end = time.monotonic() + timeout
    while True:
        busy = sum(sum(read_samples(_metrics(f"http://127.0.0.1:{port}"), _ENGINE_BUSY).values())
                   for port in engines.ports)
        if not busy or time.monotonic() > end:
            return busy
        time.sleep(0.1)


def _metrics(base: str) -> str:
    return httpx.get(base + "/metrics", timeout=10).text


async def _soak(base: str, ref: str, engines: _Engines, seconds: float, concurrency: int, seed: int, recovery: int,
                check: int, faults: tuple[str, ...] = FAULTS) -> Report:
    import openai

    report, rng = Report(), random.Random(seed)
    clients = [openai.AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=40) for _, _, key in TENANTS]
    client = clients[0]
    refc = openai.AsyncOpenAI(base_url=ref + "/v1", api_key="unused", max_retries=0, timeout=40)
    done: list[tuple[dict, dict]] = []
    until = time.monotonic() + seconds
    count = iter(range(10**9))

    async def worker(w: int) -> None:
        r = random.Random(seed * 1000 + w)
        while time.monotonic() < until:
            req = _request(r, next(count))
            done.append((req, await _ask(clients[w % len(clients)], req)))

    try:
        await asyncio.gather(_chaos(engines, rng, until, report, faults), *(worker(w) for w in range(concurrency)))
        async with httpx.AsyncClient(timeout=5) as ac:  # every fault cleared, every replica healthy again
            for port in engines.ports:
                if engines.procs[port].poll() is not None:
                    await asyncio.to_thread(engines.restart, port)
                await ac.delete(f"http://127.0.0.1:{port}/admin/faults")
        n = len(engines.ports)
        await asyncio.to_thread(_wait, base + "/health", 60, lambda r: r.json().get("replicas_healthy") == n)
        after = [await _ask(client, _request(rng, 10**9 + k, plain=True)) for k in range(recovery)]
        report.recovery, report.recovery_ok = recovery, sum(a["ok"] is True for a in after)
        report.requests = len(done)
        oks = [(q, a) for q, a in done if a["ok"]]
        report.succeeded = len(oks)
        report.abandoned = sum(a["ok"] is None for _, a in done)
        for q, a in random.Random(seed).sample(oks, min(check, len(oks))):
            want = await _ask(refc, q)
            got, exp = (a["text"], a["finish"], a["usage"]), (want.get("text"), want.get("finish"), want.get("usage"))
            if got != exp:
                report.mismatches.append(f"{'stream' if q['stream'] else 'whole'} max_tokens={q['max_tokens']}: "
                                         f"got {got[0][-40:]!r} {got[1:]} want {str(exp[0])[-40:]!r} {exp[1:]}")
        report.checked = min(check, len(oks))
        for q, a in done:
            report.slowest_s = max(report.slowest_s, a["s"])
            if a["ok"] is False:
                kind = a["kind"]
                if "x-steersman-deadline-ms" in (q.get("headers") or {}) and (
                        kind in (503, 504) or (kind == 400 and "deadline" in a["msg"])):
                    # refused as predicted late (400: too short for the request itself), or cut at its deadline:
                    # what the header asked for
                    kind = "deadline"
                key = (kind, a["partial"])
                if not report.failures[key]:
                    report.failure_messages.append(f"{kind}{' (after output)' if a['partial'] else ''}: {a['msg']}")
                report.failures[key] += 1
    finally:
        for c in (*clients, refc):
            await c.close()
    report.engines_busy_after = await asyncio.to_thread(_engines_busy, engines)
    text = await asyncio.to_thread(_metrics, base)
    m = read_samples(text, {"steersman:requests_total": "requests", "steersman:requests_in_flight": "in_flight"})
    report.gateway_requests = m.get("requests", 0.0)
    report.in_flight_after = m.get("in_flight", -1.0)
    report.retries = read_labelled(text, "steersman:retries_total", "outcome")
    return report


def _check_faults(faults: tuple[str, ...]) -> None:
    if not faults or set(faults) - set(FAULTS):
        raise ValueError(f"faults must be some of {', '.join(FAULTS)}, got {faults!r}")


def run(seconds: float = 60.0, concurrency: int = 24, seed: int = 1, replicas: int = 4, speedup: float = 20.0,
        recovery: int = 20, check: int = 600, max_num_seqs: int | None = None,
        faults: tuple[str, ...] = FAULTS) -> Report:
    """Run the soak (about ``seconds`` + 10-20 s) and return what it found.  ``max_num_seqs``: the engines' batch
    limit (a small one overloads the fleet: requests queue in the gateway, late and sheddable ones are refused).
    ``faults``: the kinds injected, in turn (a subset of :data:`FAULTS`)."""
    _check_faults(faults)
    with tempfile.TemporaryDirectory(prefix="steersman-chaos-") as tmp:
        logs = Path(tmp)
        engines = _Engines(replicas, speedup, logs, max_num_seqs)
        ref = _Engines(1, speedup, logs)
        gw = None
        try:
            for port in engines.ports + ref.ports:
                (engines if port in engines.ports else ref).start(port)
            for port in engines.ports + ref.ports:
                _wait(f"http://127.0.0.1:{port}/health", 120)
            gport = free_port()
            cfg = logs / "fleet.yaml"
            cfg.write_text("\n".join([f"gateway: {{host: 127.0.0.1, port: {gport}}}", "tenants:"] + [
                f"  {name}: {{priority: {prio}}}" for name, prio, _ in TENANTS] + ["api_keys:"] + [
                f"  - {{sha256: {hashlib.sha256(key.encode()).hexdigest()}, tenant: {name}}}" for name, _, key in TENANTS]
                + ["endpoints:"] + [
                f'  - {{name: e{i}, url: "http://127.0.0.1:{p}", engine: engine-sim, models: [{MODEL}], gpu: H100}}'
                for i, p in enumerate(engines.ports)]) + "\n")
            gw = subprocess.Popen([sys.executable, "-m", "steersman", "serve", "--config", str(cfg)],
                                  stdout=open(logs / "gateway.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                  start_new_session=True)
            base = f"http://127.0.0.1:{gport}"
            _wait(base + "/health", 120)
            return asyncio.run(_soak(base, f"http://127.0.0.1:{ref.ports[0]}", engines, seconds, concurrency, seed,
                                     recovery, check, faults))
        finally:
            if gw is not None:
                gw.terminate()
                try:
                    gw.wait(20)
                except subprocess.TimeoutExpired:
                    gw.kill()
                    gw.wait()
            engines.stop()
            ref.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--speedup", type=float, default=20.0)
    ap.add_argument("--max-num-seqs", type=int, default=None, help="the engines' batch limit (small: an overload)")
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"the kinds injected in turn (default: {','.join(FAULTS)})")
    a = ap.parse_args(argv)
    faults = tuple(f for f in a.faults.split(",") if f)
    try:  # refused before the soak starts; an error inside the soak stays a traceback
        _check_faults(faults)
    except ValueError as e:
        ap.error(str(e))
    r = run(a.seconds, a.concurrency, a.seed, a.replicas, a.speedup, max_num_seqs=a.max_num_seqs, faults=faults)
    print(r.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
