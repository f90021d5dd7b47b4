"""The prompt as the engine will see it: token count and prefix block hashes.

Same tokenizer, chat rendering and block hashing as engine-sim, so the gateway's
prefix index and a simulated engine's cache agree block for block (for other
engines the hashes are an approximation of their own; the index is approximate
anyway).
"""

from __future__ import annotations

from steersman.api.schema import ChatCompletionRequest, CompletionRequest
from steersman.text import block_hashes, render_chat, tokenize

__all__ = ["prompt_shape"]


def prompt_shape(req: ChatCompletionRequest | CompletionRequest, block_size: int) -> tuple[int, tuple[int, ...]]:
    """(prompt tokens, chained hashes of its full blocks)."""
    if isinstance(req, ChatCompletionRequest):
        ids = tokenize(render_chat(req.messages, continue_final=req.continue_final_message))
    else:
        p = req.prompt
        if isinstance(p, list):
            first = p[0]
            if isinstance(first, int):
                ids = list(p)  # token ids
            elif isinstance(first, list):
                ids = list(first)
            else:
                ids = tokenize("".join(x for x in p if isinstance(x, str)))
        else:
            ids = tokenize(p)
    return len(ids), tuple(block_hashes(ids, block_size))
