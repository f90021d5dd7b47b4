"""Helpers shared by the engine-model tests (imported as `simhelpers`)."""

from __future__ import annotations

import dataclasses
import zlib

from steersman.config import EngineSettings
from steersman.sim import EngineModel, SimRequest, gpu_profile, model_profile
from steersman.text.tokenizer import block_hashes

BS = 16


def settings(**kw) -> EngineSettings:
    kw.setdefault("max_model_len", 4096)
    kw.setdefault("step_overhead_s", 0.002)
    return dataclasses.replace(EngineSettings(), **kw)


def engine(kv_blocks: int | None = 1000, gpu: str = "H100", model: str = "llama-3.1-8b", warm: bool = True, **kw):
    if kv_blocks is not None:
        kw.setdefault("max_model_len", min(4096, kv_blocks * BS))
    return EngineModel(gpu_profile(gpu), model_profile(model), settings(**kw), warm=warm, kv_blocks=kv_blocks)


def tokens(seed: int, n: int) -> list[int]:
    """Deterministic distinct token ids for prompt ``seed``."""
    return [seed * 1_000_003 + i for i in range(n)]


def req(rid: str, prompt: int | list[int], out: int = 4, seed: int | None = None, **kw) -> SimRequest:
    """A request; ``prompt`` is a length (unique tokens, from ``seed`` or the id) or a token list."""
    if isinstance(prompt, int):
        prompt = tokens(seed if seed is not None else zlib.crc32(rid.encode()) % 100_000, prompt)
    return SimRequest(rid, len(prompt), out, block_hashes(prompt, BS), **kw)


def run(eng: EngineModel, t: float = 0.0, max_steps: int = 100_000):
    """Step until idle; returns the list of StepResults."""
    results = []
    while eng.has_work() and len(results) < max_steps:
        r = eng.step(t)
        assert r is not None
        results.append(r)
        t = r.end
    return results


def expected_blocks(eng: EngineModel) -> int:
    """Blocks the running requests must hold: ceil(computed / block_size) each, shared ones once."""
    seen = set()
    total = 0
    for r in eng.running():
        for i, h in enumerate(r.blocks):
            if h is None:
                total += 1
            elif h not in seen:
                seen.add(h)
                total += 1
        assert len(r.blocks) == -(-r.num_computed // BS)
    return total
