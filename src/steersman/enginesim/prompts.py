"""What engine-sim generates after: a request's prompts, read as vLLM reads them.

A chat request has one prompt (its messages rendered and tokenized).  A completion's ``prompt`` is a string,
token ids, or a batch of either (a list of strings, a list of token-id lists): vLLM answers a batch with a
choice per prompt and sample (``index = prompt * n + sample``), each prompt a request of its own in the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from steersman.api.errors import bad_request
from steersman.api.schema import ChatCompletionRequest, CompletionRequest
from steersman.text import render_chat
from steersman.text.chat_tokens import tokenize_chat_array
from steersman.text.tokenizer import tokenize_array

__all__ = ["Prompt", "read_prompts", "token_ids", "truncation"]


@dataclass(frozen=True, slots=True)
class Prompt:
    ids: Sequence[int] | np.ndarray  # its token ids
    context: str | list[int]  # what the output is a function of: the text, or the ids
    tail: str  # the context's last character ("x" for ids): how the first word joins it
    echo: str = ""  # what a completion echoes before its output (vLLM's ``echo``), "" when not asked


def _text_only(messages) -> None:
    """Every simulated model is a text model: an image, audio or file part is a 400 naming it (vLLM refuses
    multimodal input to a text-only model; llama-server does with a 500, which the gateway relays as a 400)."""
    for i, m in enumerate(messages):
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                kind = part.get("type")  # a part is an object (api.schema.ChatMessage)
                if kind != "text":
                    raise bad_request(f"`messages[{i}].content[{j}]` is {str(kind)[:40]!r} content: the model is "
                                      "text-only, only text parts are supported.", f"messages[{i}].content[{j}]",
                                      "unsupported_value")


def read_prompts(req: ChatCompletionRequest | CompletionRequest, chat: bool, vocab: int | None = None) -> list[Prompt]:
    """The request's prompts; ``vocab``: the model's vocabulary size (a token id at or over it is a 400, as vLLM's)."""
    if chat:
        # vLLM: `continue_final_message` continues the last assistant message (an assistant prefix);
        # it excludes `add_generation_prompt`, like vLLM's request validation
        if req.continue_final_message:
            if req.add_generation_prompt:
                raise bad_request("`continue_final_message` needs `add_generation_prompt: false`.", "add_generation_prompt")
            if req.messages[-1].role != "assistant":
                raise bad_request("`continue_final_message` needs a final assistant message.", "messages")
        _text_only(req.messages)
        text = render_chat(req.messages, req.continue_final_message, req.tools)  # as the gateway's prompt_shape
        return [Prompt(tokenize_chat_array(req.messages, req.continue_final_message, None, req.tools), text, text[-1:])]
    p = req.prompt
    if isinstance(p, str):
        batch: list = [p]
    elif p and all(isinstance(x, int) for x in p):
        batch = [p]  # one prompt of token ids
    elif p and all(isinstance(x, str) for x in p) or p and all(isinstance(x, list) for x in p):
        batch = list(p)
    elif not p:
        raise bad_request("`prompt` must not be empty.", "prompt")
    else:
        raise bad_request("`prompt` must be a string, token ids, or a list of either, not a mix.", "prompt")
    if req.suffix is not None:  # vLLM's completion serving: "suffix is not currently supported"
        raise bad_request("`suffix` is not supported.", "suffix")
    if req.echo and req.logprobs is not None:
        raise bad_request("engine-sim gives no prompt log probabilities: `echo` with `logprobs` is not supported.", "echo")
    out = []
    for x in batch:
        if isinstance(x, str):
            out.append(Prompt(tokenize_array(x), x, x[-1:], x if req.echo else ""))
        else:
            if req.echo:
                raise bad_request("engine-sim echoes text prompts only: it has no detokenizer for token ids.", "echo")
            out.append(Prompt(token_ids(x, "prompt", vocab), list(x), "x"))
    return out


def truncation(k: int | None, max_model_len: int) -> int | None:
    """How many of a prompt's last tokens vLLM keeps for ``truncate_prompt_tokens`` = ``k`` (None: all; -1: the
    model's context); over the context it is a 400 naming the field, as vLLM's."""
    if k is None:
        return None
    if k == -1:
        return max_model_len
    if k > max_model_len:
        raise bad_request(f"truncate_prompt_tokens value ({k}) is greater than max_model_len ({max_model_len}). "
                          "Please, select a smaller truncation size.", "truncate_prompt_tokens")
    return k


def token_ids(ids: list, field: str, vocab: int | None = None) -> list[int]:
    """A prompt given as token ids; a negative id is no token, nor one past the vocabulary (vLLM: 400, "Token id
    ... is out of vocabulary")."""
    bad = next((i for i in ids if not isinstance(i, int) or i < 0), None)
    if bad is not None:
        raise bad_request(f"`{field}` token ids must be >= 0, got {bad}.", field)
    top = max(ids, default=0)
    if vocab is not None and top >= vocab:
        raise bad_request(f"Token id {top} is out of vocabulary (the model's has {vocab} tokens).", field)
    return list(ids)
