"""``POST /v1/embeddings``: the request, decoded and checked as OpenAI checks it.

An embedding request is prefill only (no generated token): the gateway routes it like a completion whose prompt
is the input (a batch of inputs is a batch of prompts) and one token of output, so the scheduler's prefill
predictions, admission and token budgets apply unchanged.  Engines serve it from an embedding model (vLLM's
pooling runner, llama-server ``--embeddings``, engine-sim's mean-pooled vectors); a brown-out never moves it to
another model, whose vectors would not be comparable.
"""

from __future__ import annotations


import msgspec

from steersman.api.errors import bad_request
from steersman.api.schema import EMPTY_CACHE_SALT, check_truncation, decode_with

__all__ = ["EmbeddingRequest", "decode_embedding", "MAX_INPUTS"]

MAX_INPUTS = 2048  # OpenAI: "The input must not ... be an array of more than 2048 embedding inputs"


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[str | int | list[int]]  # one text, texts, token ids, or lists of token ids
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None
    priority: int = 0
    cache_salt: str | None = None
    truncate_prompt_tokens: int | None = None  # vLLM's: the last k tokens of each input (left truncation), -1 the model's

    # what the request path reads of every request
    stream = False
    n = 1
    output_limit = 1  # a prefill: the scheduler counts it as one token of output
    guided = False

    @property
    def prompt(self) -> str | list[str | int | list[int]]:
        return self.input


_decoder = msgspec.json.Decoder(EmbeddingRequest)


def decode_embedding(body: bytes) -> EmbeddingRequest:
    req: EmbeddingRequest = decode_with(_decoder, body)
    if not req.model:
        raise bad_request("`model` must be a non-empty string.", "model")
    if req.cache_salt == "":
        raise bad_request(EMPTY_CACHE_SALT, "cache_salt")
    inp = req.input
    if isinstance(inp, str):
        if not inp:
            raise bad_request("'input' must not be an empty string.", "input")
    else:
        if not inp:
            raise bad_request("'input' must not be an empty array.", "input", "empty_array")
        if len({type(x) for x in inp}) != 1:
            raise bad_request("'input' must be a string, an array of strings, an array of token ids or an array of "
                              "such arrays.", "input")
        if len(inp) > MAX_INPUTS and not isinstance(inp[0], int):
            raise bad_request(f"'input' has {len(inp)} entries: at most {MAX_INPUTS} are allowed.", "input")
        for i, x in enumerate(inp):
            if isinstance(x, str) and not x:
                raise bad_request(f"'input[{i}]' must not be an empty string.", f"input[{i}]")
            if isinstance(x, list) and not x:
                raise bad_request(f"'input[{i}]' must not be an empty array of tokens.", f"input[{i}]")
            ids = (x,) if isinstance(x, int) else x if isinstance(x, list) else ()
            if any(t < 0 for t in ids):
                raise bad_request("Token ids in 'input' must not be negative.", "input" if isinstance(x, int) else f"input[{i}]")
    if req.encoding_format not in ("float", "base64"):
        raise bad_request(f"Invalid value for 'encoding_format': {req.encoding_format!r}. Supported values are: "
                          "'float' and 'base64'.", "encoding_format")
    if req.dimensions is not None and req.dimensions < 1:
        raise bad_request(f"'dimensions' must be at least 1, got {req.dimensions}.", "dimensions")
    check_truncation(req.truncate_prompt_tokens)
    return req
