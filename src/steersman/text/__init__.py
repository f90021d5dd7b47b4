"""Text handling shared by the gateway and the engine model.

The gateway must see a prompt the way a (simulated) engine sees it: same
tokenizer, same chat rendering, same 16-token block hashes.  Everything here is
pure and deterministic across processes.
"""

from steersman.text.chat import render_chat
from steersman.text.chat_tokens import tokenize_chat
from steersman.text.tokenizer import BlockHashes, Tokenizer, block_hashes, count_tokens, tokenize

__all__ = ["BlockHashes", "Tokenizer", "block_hashes", "count_tokens", "render_chat", "tokenize", "tokenize_chat"]
