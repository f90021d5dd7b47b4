"""Live fault drills: engine-sim replicas with fault injection behind a real gateway on 127.0.0.1.

Engines run ``SPEEDUP`` times faster than real time, so the issue's wall-time
numbers (ejected within 10 s, recovered within 60 s, the 30 s base ejection, the
5 s breaker sleep window) are divided by ``SPEEDUP`` here; each test passes the
scaled reliability settings to its gateway and stays well under 30 s.
"""

import time

import httpx

SPEEDUP = 10.0
MODEL = "llama-3.1-8b"


def scaled(**extra):
    """Reliability settings with the issue's times divided by SPEEDUP."""
    return {"base_ejection_time_s": 30.0 / SPEEDUP, "max_ejection_time_s": 300.0 / SPEEDUP,
            "ejection_decay_s": 10.0 / SPEEDUP, "breaker_open_s": 5.0 / SPEEDUP, "breaker_window_s": 10.0 / SPEEDUP,
            **extra}


def body(text: str, max_tokens: int = 16) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True, "messages": [{"role": "user", "content": text}]}


def fault(url: str, **spec) -> None:
    r = httpx.post(url + "/admin/faults", json=spec) if spec else httpx.delete(url + "/admin/faults")
    assert r.status_code == 200, r.text


def until(cond, what: str, timeout: float = 10.0) -> float:
    """Poll ``cond`` (bounded); returns the seconds it took."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting: {what}"
        time.sleep(0.01)
    return time.monotonic() - t0


def background(coro_fn):
    """Run ``coro_fn()`` on its own loop in a thread; returns (thread, box) — box["v"] holds the result."""
    import asyncio
    import threading

    box = {}

    def main():
        try:
            box["v"] = asyncio.run(coro_fn())
        except BaseException as e:  # noqa: BLE001 — re-raised by the test
            box["e"] = e

    th = threading.Thread(target=main, daemon=True)
    th.start()
    return th, box


def result(th, box, timeout: float = 60.0):
    th.join(timeout)
    assert not th.is_alive(), "load did not finish"
    if "e" in box:
        raise box["e"]
    return box["v"]
