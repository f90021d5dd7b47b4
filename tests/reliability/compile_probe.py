"""Run live scenarios through a fresh gateway and report the compiled kernels each one added (a script).

``tests/reliability/test_no_compile_on_request_path.py`` runs this in a new interpreter, as a
gateway process starts: numba compiles (or loads from its disk cache) one machine-code version
of a kernel per argument-type signature, on the calling thread.  On the gateway that thread is the
event loop, so a signature first met by a request stalls every stream in flight for the compile
(~0.5-1 s on a cold cache, i.e. after every upgrade) or the load (~20 ms).  The gateway's start-up
warm-up must leave nothing for requests to compile, failure paths included: the first retry or
stream continuation after start is exactly when a stall hurts most.

Prints one JSON object: ``{"scenarios": {name: {kernel: signatures added}}, "metrics": {...}}``.

    .venv/bin/python tests/reliability/compile_probe.py [POLICY]
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from numba.core.registry import CPUDispatcher
from openai import OpenAI

from steersman.enginesim.app import SimServerConfig
from steersman.enginesim.faults import FaultSpec
from steersman.testing import LiveFleet
from steersman.testing.scripted import Script

FAILOVER = "llama-3.1-8b"  # two replicas: a stream continues on the other, then on none
RETRY = "qwen2.5-7b"  # three replicas: connections refused by all three, the request retried on each
UNPROFILED = "scripted"  # two OpenAI-compatible engines without a GPU profile (no roofline: the fallback model)


def kernels() -> dict[str, int]:
    """Signatures compiled so far, per kernel of every loaded steersman module."""
    out = {}
    for m in list(sys.modules.values()):
        if not (getattr(m, "__name__", None) or "").startswith("steersman"):
            continue
        for v in list(vars(m).values()):
            if isinstance(v, CPUDispatcher):
                out[f"{v.py_func.__module__}.{v.py_func.__name__}"] = len(v.signatures)
    return out


def counter(url: str, prefix: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(prefix)}


def main(policy: str) -> dict:
    sims = ([SimServerConfig(gpu="H100", model=FAILOVER, speedup=50.0, port=0) for _ in range(2)]
            + [SimServerConfig(gpu="H100", model=RETRY, speedup=50.0, port=0) for _ in range(3)])
    scenarios: dict[str, dict[str, int]] = {}
    scripts = [Script(pieces=("Hello", ",", " world", "."), model=UNPROFILED) for _ in range(2)]
    with LiveFleet(sims=sims, scripted=scripts, policy=policy) as lf:
        client = OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=30)

        def chat(model: str, text: str, max_tokens: int = 8, stream: bool = True) -> None:
            msgs = [{"role": "user", "content": text}]
            if not stream:
                client.chat.completions.create(model=model, max_tokens=max_tokens, messages=msgs)
                return
            for _ in client.chat.completions.create(model=model, max_tokens=max_tokens, stream=True, messages=msgs):
                pass

        def fault(i: int, **spec) -> None:
            async def f() -> None:
                lf.sims[i].faults.apply(FaultSpec(**spec))
                if spec.get("refuse_for_s"):
                    await lf.sims[i].http.stop()  # at once (the admin endpoint's refuse() does this in a task)

            lf.call(f)

        def scenario(name: str, fn) -> None:
            before = kernels()
            try:
                fn()
            except Exception as e:  # noqa: BLE001 -- a failed request is part of some scenarios
                print(f"{name}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
            after = kernels()
            scenarios[name] = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}

        def refused_then_back() -> None:
            for i in (2, 3, 4):  # every replica of the model: the request is retried on each, then fails
                fault(i, refuse_for_s=1.0)
            try:
                chat(RETRY, "retry: hello")
            finally:
                async def back() -> None:
                    for i in (2, 3, 4):
                        await lf.sims[i].http.start(lf.sims[i].cfg.host, lf.sims[i].port)
                lf.call(back)

        scenario("short chat", lambda: chat(FAILOVER, "hello there"))
        scenario("long chat (compiled tokenizer)", lambda: chat(FAILOVER, "a long question about fleets " * 20))
        scenario("shared prefix", lambda: chat(FAILOVER, "a long question about fleets " * 20 + "and more"))
        scenario("non-ASCII chat", lambda: chat(RETRY, "une question très longue, 日本語のテキスト 🚀 " * 5))
        scenario("not streamed", lambda: chat(RETRY, "hello again", stream=False))
        scenario("completion of token ids",
                 lambda: client.completions.create(model=RETRY, max_tokens=4, prompt=list(range(100, 180))))
        scenario("unprofiled replicas", lambda: [chat(UNPROFILED, f"no roofline {k} " * (1 + 20 * k)) for k in range(3)])
        scenario("burst of 64 (queueing)", lambda: list(ThreadPoolExecutor(32).map(
            lambda k: chat(RETRY if k % 2 else FAILOVER, f"burst {k} " * 10, 16), range(64))))
        scenario("retry (connection refused)", refused_then_back)
        for i in (0, 1):
            fault(i, die_after_tokens=3)
        scenario("stream continued, then no replica left", lambda: chat(FAILOVER, "Tell me about replicas.", 12))
        scenario("after the failures", lambda: [chat(RETRY, f"after {k}") for k in range(4)])
        metrics = {**counter(lf.url, "steersman:retries_total"), **counter(lf.url, "steersman:stream_migrations_total")}
    return {"scenarios": scenarios, "metrics": metrics}


if __name__ == "__main__":
    t0 = time.perf_counter()
    out = main(sys.argv[1] if len(sys.argv) > 1 else "steersman")
    out["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))
