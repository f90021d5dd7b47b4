"""The prompt as the engine will see it: token count and prefix block hashes.

Same tokenizer, chat rendering and block hashing as engine-sim, so the gateway's
prefix index and a simulated engine's cache agree block for block (for other
engines the hashes are an approximation of their own; the index is approximate
anyway).
"""

from __future__ import annotations

import zlib

from steersman.api.schema import ChatCompletionRequest, CompletionRequest
from steersman.text.chat_tokens import tokenize_chat_array
from steersman.text.tokenizer import ROOT_HASH, BlockHashes, block_hash_tuple, tokenize_array

__all__ = ["prompt_shape", "cache_root", "with_cache_salt"]


def cache_root(salt: str | None) -> int:
    """The parent hash of block 0: prompts share cached blocks only under the same ``cache_salt`` (vLLM)."""
    if not salt:
        return ROOT_HASH
    return hash((ROOT_HASH, zlib.crc32(salt.encode("utf-8", "surrogatepass"))))


def with_cache_salt(body: bytes, salt: str) -> bytes:
    """``body`` (a JSON object) with ``cache_salt`` set last, so it wins over one the client sent."""
    b = body.rstrip()
    if not b.endswith(b"}"):
        return body  # not an object: parsing will refuse it
    field = b'"cache_salt":"' + salt.encode() + b'"}'
    inner = b[:-1].rstrip()
    return inner + (field if inner.endswith(b"{") else b"," + field)


def prompt_shape(req: ChatCompletionRequest | CompletionRequest, block_size: int) -> tuple[int, BlockHashes]:
    """(prompt tokens, chained hashes of its full blocks)."""
    if isinstance(req, ChatCompletionRequest):
        ids = tokenize_chat_array(req.messages, continue_final=req.continue_final_message)
    else:
        p = req.prompt
        if isinstance(p, list):
            first = p[0]
            if isinstance(first, int):
                ids = list(p)  # token ids
            elif isinstance(first, list):
                ids = list(first)
            else:
                ids = tokenize_array("".join(x for x in p if isinstance(x, str)))
        else:
            ids = tokenize_array(p)
    return len(ids), block_hash_tuple(ids, block_size, cache_root(req.cache_salt))
