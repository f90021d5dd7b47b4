"""The peers workload: many tenants sharing long system prompts, plus some unique prompts.

Deterministic for a seed, so every router sees exactly the same request sequence.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_WORDS = (
    "order refund ship warehouse invoice battery serial warranty customer policy delivery backorder safety "
    "escalate inspection payment language polite brief label return exchange courier tracking damage receipt "
    "discount voucher account password address parcel weight customs duty holiday schedule manager approval"
).split()


@dataclass(frozen=True, slots=True)
class Request:
    tenant: int | None  # None: a unique prompt
    messages: tuple[dict, ...]


def _text(rng: random.Random, words: int) -> str:
    out = []
    for i in range(words):
        w = rng.choice(_WORDS)
        out.append(w.capitalize() if i % 12 == 0 else w)
        if i % 12 == 11:
            out[-1] += "."
    return " ".join(out)


def system_prompts(tenants: int, words: int, seed: int) -> list[str]:
    return [f"Tenant {t} support policy. " + _text(random.Random(seed * 1000 + t), words) for t in range(tenants)]


def requests(n: int, tenants: int, system_words: int, unique_frac: float, unique_words: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    systems = system_prompts(tenants, system_words, seed)
    weights = [1.0 / (t + 1) for t in range(tenants)]  # Zipf-like: a few big tenants, a long tail
    out = []
    for i in range(n):
        if rng.random() < unique_frac:
            msgs = ({"role": "user", "content": f"Request {i}. " + _text(rng, unique_words)},)
            out.append(Request(None, msgs))
        else:
            t = rng.choices(range(tenants), weights)[0]
            q = f"Question {i}: " + _text(rng, 12)
            out.append(Request(t, ({"role": "system", "content": systems[t]}, {"role": "user", "content": q})))
    return out
