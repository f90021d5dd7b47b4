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
    """(prompt tokens, chained hashes of its full blocks).  A completion's batch of prompts (strings or token-id
    lists, each its own sequence in the engine) counts every prompt's tokens; its blocks are the first prompt's
    (a batch's prompts typically share their few-shot prefix: where the first is cached, the rest hit too)."""
    if isinstance(req, ChatCompletionRequest):
        ids = tokenize_chat_array(req.messages, continue_final=req.continue_final_message)
        return len(ids), block_hash_tuple(ids, block_size, cache_root(req.cache_salt))
    p = req.prompt
    extra = 0
    if isinstance(p, list) and p and not isinstance(p[0], int):  # a batch
        ids = list(p[0]) if isinstance(p[0], list) else tokenize_array(p[0])
        for x in p[1:]:
            extra += len(x) if isinstance(x, list) else len(tokenize_array(x)) if isinstance(x, str) else 0
    elif isinstance(p, list):
        ids = list(p)  # token ids
    else:
        ids = tokenize_array(p)
    return len(ids) + extra, block_hash_tuple(ids, block_size, cache_root(req.cache_salt))
