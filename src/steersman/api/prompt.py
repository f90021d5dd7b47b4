"""The prompt as the engine will see it: token count and prefix block hashes.

Same tokenizer, chat rendering and block hashing as engine-sim, so the gateway's
prefix index and a simulated engine's cache agree block for block (for other
engines the hashes are an approximation of their own; the index is approximate
anyway).
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import msgspec

from steersman.api.body import with_member
from steersman.api.schema import ChatCompletionRequest, CompletionRequest
from steersman.text.chat_tokens import tokenize_chat_array
from steersman.text.tokenizer import ROOT_HASH, BlockHashes, block_hash_tuple, tokenize_array

__all__ = ["prompt_shape", "batch_shape", "cache_root", "with_cache_salt", "SALT_SEPARATOR"]

#: between the tenant's salt and the client's own in the ``cache_salt`` the gateway forwards (the tenant's is
#: ``steersman-`` and hex: the combination is unambiguous)
SALT_SEPARATOR = "|"
_ROOTS_KEPT = 4096  # salts whose root is remembered (a tenant's, or a tenant's and user's, recur request after request)


def cache_root(salt: str | None) -> int:
    """The parent hash of block 0: prompts share cached blocks only under the same ``cache_salt`` (vLLM)."""
    if not salt:
        return ROOT_HASH
    return _salted_root(salt)


@functools.lru_cache(maxsize=_ROOTS_KEPT)
def _salted_root(salt: str) -> int:
    """The salt's 64-bit BLAKE2b mixed into the root: a 32-bit checksum (CRC-32) let two salts found in seconds
    share each other's blocks, one user reading another's cache hits."""
    digest = hashlib.blake2b(salt.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return hash((ROOT_HASH, int.from_bytes(digest, "little", signed=True)))


class _Salted(msgspec.Struct):
    """The one field of a request body :func:`with_cache_salt` reads (msgspec skips the rest without building it)."""

    cache_salt: Any = None


_salted = msgspec.json.Decoder(_Salted)
_INVALID = object()


def with_cache_salt(body: bytes, salt: str) -> bytes:
    """``body`` (a JSON object) with ``cache_salt`` set last, so it wins over one the client sent: the tenant's
    ``salt``, then, when the client sent one, the client's own after :data:`SALT_SEPARATOR` (a client that salts
    its users apart keeps them apart within the tenant).  A client's salt that is not a non-empty string is left
    as sent, for the request's checks (or the engine: vLLM's 400) to refuse."""
    b = body.rstrip()
    if not b.endswith(b"}"):
        return body  # not an object: parsing will refuse it
    if b"cache_salt" in b or b"\\u" in b:  # the client may have sent one (a key may be spelt with \u escapes)
        own = _client_salt(b)
        if own is _INVALID:
            return body
        if own is not None:
            salt = salt + SALT_SEPARATOR + own
    return with_member(b, b"cache_salt", msgspec.json.encode(salt))


def _client_salt(body: bytes) -> Any:
    """The body's ``cache_salt``: None when absent or null, the string, or ``_INVALID`` (not JSON, not a
    non-empty string: the body is refused later, as it stands)."""
    try:
        own = _salted.decode(body).cache_salt
    except msgspec.DecodeError:  # (a ValidationError too: the body is not an object)
        return _INVALID
    if own is None or (isinstance(own, str) and own):
        return own
    return _INVALID


def prompt_shape(req: ChatCompletionRequest | CompletionRequest, block_size: int) -> tuple[int, BlockHashes]:
    """(prompt tokens, chained hashes of its full blocks): :func:`batch_shape` without the longest input."""
    tokens, hashes, _ = batch_shape(req, block_size)
    return tokens, hashes


def batch_shape(req: ChatCompletionRequest | CompletionRequest, block_size: int) -> tuple[int, BlockHashes, int | None]:
    """(prompt tokens, chained hashes of its full blocks, the longest single prompt's tokens of a batch or None).
    A completion's or embedding's batch of prompts (strings or token-id lists, each its own sequence in the
    engine) counts every prompt's tokens; its blocks are the first prompt's (a batch's prompts typically share
    their few-shot prefix: where the first is cached, the rest hit too); whether a replica can ever hold the
    request is judged by its longest prompt (the engine runs them apart), its load by the total.  vLLM's
    ``truncate_prompt_tokens`` k keeps each prompt's last k tokens: they are what is counted and hashed."""
    keep = getattr(req, "truncate_prompt_tokens", None)
    keep = keep if keep is not None and keep > 0 else None  # vLLM's left truncation (-1: the model's context)
    extra = 0
    others: list[int] | None = None  # a batch's other prompts' tokens
    if isinstance(req, ChatCompletionRequest):
        ids = tokenize_chat_array(req.messages, req.continue_final_message, None, req.tools)
    elif isinstance(p := req.prompt, list) and p and not isinstance(p[0], int):  # a batch
        ids = list(p[0]) if isinstance(p[0], list) else tokenize_array(p[0])
        others = [len(x) if isinstance(x, list) else len(tokenize_array(x)) if isinstance(x, str) else 0
                  for x in p[1:]]
    elif isinstance(p, list):
        ids = list(p)  # token ids
    else:
        ids = tokenize_array(p)
    if keep is not None:
        ids = ids[-keep:]
    longest = None
    if others is not None:
        if keep is not None:
            others = [min(n, keep) for n in others]
        extra = sum(others)
        longest = max([len(ids), *others])
    return len(ids) + extra, block_hash_tuple(ids, block_size, cache_root(req.cache_salt)), longest
