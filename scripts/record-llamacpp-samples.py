#!/usr/bin/env python3
"""Record real llama-server ``/metrics`` and ``/slots`` pages for tests/engines/data/.

Starts one llama-server (steersman's launch flags, -np 4), then records:
  * ``llamacpp_metrics_idle.txt`` / ``llamacpp_slots_idle.json``: after two requests sharing a
    prefix (the second reuses the cached prefix), everything finished;
  * ``llamacpp_metrics_busy.txt`` / ``llamacpp_slots_busy.json``: while 3 long streams run
    (and 3 more wait, with ``-np 2`` for that phase so some are deferred).

    .venv/bin/python scripts/record-llamacpp-samples.py [--out tests/engines/data]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from steersman.config import DEFAULTS
from steersman.fleet.processes import LlamaServerFleet

PREFIX = "You are a helpful assistant for a hardware store. " + " ".join(f"Policy {i}: be brief and exact." for i in range(40))


def _post(url: str, body: dict, timeout: float = 120) -> bytes:
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def _get(url: str, path: str) -> bytes:
    with urllib.request.urlopen(url + path, timeout=30) as r:
        return r.read()


def _chat(user: str, max_tokens: int, **extra) -> dict:
    return {"model": "gemma-3-270m", "max_tokens": max_tokens, "temperature": 0, **extra,
            "messages": [{"role": "system", "content": PREFIX}, {"role": "user", "content": user}]}


def _record(out: Path, tag: str, url: str) -> None:
    (out / f"llamacpp_metrics_{tag}.txt").write_bytes(_get(url, "/metrics"))
    slots = json.loads(_get(url, "/slots"))
    for s in slots:  # keep the files small and free of generated text
        s.pop("prompt", None)
        s.pop("generated", None)
    (out / f"llamacpp_slots_{tag}.json").write_text(json.dumps(slots, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests/engines/data"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)

    idle = LlamaServerFleet(1)
    asyncio.run(idle.start())
    try:
        url = idle.procs[0].url
        _post(url, _chat("What is policy 3?", 8))
        _post(url, _chat("What is policy 7?", 8))  # reuses the cached system prompt
        _record(out, "idle", url)
    finally:
        asyncio.run(idle.stop())

    busy = LlamaServerFleet(1, settings=replace(DEFAULTS.llamacpp, parallel=2))
    asyncio.run(busy.start())
    try:
        url = busy.procs[0].url
        threads = [threading.Thread(target=_post, args=(url, _chat(f"Write a long story number {i}.", 200, ignore_eos=True)))
                   for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(3.0)  # generation under way; two requests deferred behind the 2 slots
        _record(out, "busy", url)
        for t in threads:
            t.join()
    finally:
        asyncio.run(busy.stop())
    print("recorded into", out)


if __name__ == "__main__":
    main()
