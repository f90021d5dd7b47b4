#!/usr/bin/env python
"""Gateway CPU to read a request's prompt on bench/peers' engine-sim workload: decode the body, render the
chat, tokenize, hash the blocks (``steersman.api.prompt.prompt_shape``), per request.

    .venv/bin/python bench/peers/prompt_shape.py

18 tenants with ~1,800-token system prompts plus unique prompts, 400 requests, each body decoded anew
(fresh strings, as the gateway sees them).  To compare with an older tree, run it there too
(``PYTHONPATH=<old tree>/src``) right after this one.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workload import requests  # noqa: E402

from steersman.api.prompt import prompt_shape  # noqa: E402
from steersman.api.schema import decode_chat  # noqa: E402

reqs = requests(400, 18, 1500, 0.2, 600, 7)
bodies = [orjson.dumps({"model": "llama-3.1-8b", "messages": list(r.messages), "stream": True, "max_tokens": 32})
          for r in reqs]
prompt_shape(decode_chat(bodies[0], 100000), 16)  # compile / load what is compiled
best = float("inf")
for _ in range(5):
    t = time.perf_counter()
    for b in bodies:
        prompt_shape(decode_chat(b, 100000), 16)
    best = min(best, (time.perf_counter() - t) / len(bodies))
print(f"decode + prompt shape: {best * 1e6:.1f} us per request (best of 5 passes over {len(bodies)} requests)")
