"""LoRA adapters' prompts, keyed apart in the prefix index.

An engine serving LoRA adapters keeps each adapter's KV apart from the base model's and from every other
adapter's: vLLM hashes the adapter (``lora_name``; ``lora_int_id`` before) into every block of a prompt
(``kv_cache_utils.generate_block_hash_extra_keys``), SGLang keys its radix tree per adapter.  The gateway hashes a
prompt's blocks the same for every model (:mod:`steersman.api.prompt`); a request for an adapter gets them XORed
with the adapter's key, so a prompt another model's request cached on a replica is no hit there.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from steersman.text.tokenizer import BlockHashes

__all__ = ["lora_key", "rekeyed"]


@functools.lru_cache(maxsize=4096)  # adapters a fleet serves: a few, asked request after request
def lora_key(adapter: str) -> int:
    """What a LoRA adapter's prompt hashes are XORed with (:func:`rekeyed`): vLLM hashes the adapter into every
    block of its KV (``extra_keys``: ``lora_name``), so a prompt cached for one adapter is no hit for the base model
    or another adapter on the same replica.  64 bits of BLAKE2b, never 0 (0 is the base model's: no change)."""
    digest = hashlib.blake2b(b"steersman-lora\x00" + adapter.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True) or 1


def rekeyed(hashes: BlockHashes, key: int) -> BlockHashes:
    """``hashes`` under another model's key: XORed with ``key`` (``lora_key(a)`` to key a base model's hashes for
    adapter ``a``, ``lora_key(a) ^ lora_key(b)`` to move them from ``a`` to ``b``; 0 leaves them).  A bijection per
    key, and the hashes are chained already, so prefixes still match prefixes within one model, never across."""
    if not key or not hashes:
        return hashes
    array = getattr(hashes, "array", None)
    if array is None:  # a plain tuple of hashes
        array = np.array(hashes, dtype=np.int64)
    return BlockHashes.of(array ^ np.int64(key))
