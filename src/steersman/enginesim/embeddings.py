"""engine-sim's ``/v1/embeddings``: each input is a prefill in the engine model, answered with a pseudo-embedding.

Like llama-server ``--embeddings --pooling mean`` (and vLLM's pooling runner), an input runs as a prompt with no
generated token: it queues, batches and hits the prefix cache with the rest of the replica's work, so its latency
is the engine model's.  The vector is a mean of per-token vectors (rows of one fixed random matrix, picked by token
id), unit length: a deterministic function of the input's tokens, equal on every replica, whose cosine similarity
grows with the tokens two inputs share.  ``dimensions`` keeps the first ones, renormalised (as OpenAI's
text-embedding-3 models shorten theirs); ``encoding_format: base64`` sends little-endian float32s, as OpenAI does.
"""

from __future__ import annotations

import base64

import numpy as np
import orjson

from steersman.api.embeddings import decode_embedding
from steersman.api.errors import ApiError, bad_request, not_found_model
from steersman.enginesim.prompts import token_ids, truncation
from steersman.enginesim.runner import Job
from steersman.enginesim.textgen import Generation
from steersman.http.server import HttpRequest
from steersman.obs.tracing import request_id
from steersman.sim import SimRequest
from steersman.text.tokenizer import tokenize_array

__all__ = ["Embedder"]

_ROWS = 1024  # distinct token vectors (token id mod 1024): enough for similarity to follow shared tokens


class Embedder:
    """Handles ``/v1/embeddings`` for one replica (it shares the replica's engine and faults with generation)."""

    def __init__(self, generator, hidden: int) -> None:
        self.g = generator  # steersman.enginesim.generate.Generator: the model, engine runner, faults, clock, ids
        self.hidden = hidden
        self._table: np.ndarray | None = None

    def table(self) -> np.ndarray:
        if self._table is None:  # made on first use: 16 MB for a 4096-wide model
            self._table = np.random.default_rng(0x5EED).standard_normal((_ROWS, self.hidden), dtype=np.float32)
        return self._table

    def vector(self, ids: np.ndarray, dims: int) -> np.ndarray:
        v = self.table()[ids % _ROWS, :dims].mean(axis=0, dtype=np.float64)
        return (v / (np.linalg.norm(v) or 1.0)).astype(np.float32)

    def _inputs(self, inp) -> list[np.ndarray]:
        vocab = self.g.vocab
        if isinstance(inp, str):
            return [tokenize_array(inp)]
        if isinstance(inp[0], int):
            return [np.asarray(token_ids(inp, "input", vocab), dtype=np.int64)]
        return [tokenize_array(x) if isinstance(x, str) else np.asarray(token_ids(x, f"input[{k}]", vocab), dtype=np.int64)
                for k, x in enumerate(inp)]

    async def embeddings(self, request: HttpRequest) -> None:
        g = self.g
        given = request.headers.get("x-request-id")
        if given is not None:
            request.extra_headers = b"X-Request-Id: %b\r\n" % request_id(given).encode()
        jobs: list[Job] = []
        try:
            req = decode_embedding(request.body)
            if g.faults.should_error():
                raise ApiError(g.faults.spec.error_status, "Injected engine failure.", "server_error", None, "injected_fault")
            if req.model not in g.keys:
                raise not_found_model(req.model)
            dims = req.dimensions or self.hidden
            if dims > self.hidden:
                raise bad_request(f"'dimensions' is {dims}: this model's embeddings have {self.hidden}.", "dimensions")
            inputs = self._inputs(req.input)
            keep = truncation(req.truncate_prompt_tokens, g.max_model_len)
            if keep is not None:  # vLLM keeps the last k tokens of each input (left truncation)
                inputs = [ids[-keep:] for ids in inputs]
            for k, ids in enumerate(inputs):
                if len(ids) > g.max_model_len:
                    raise bad_request(f"This model's maximum context length is {g.max_model_len} tokens. However, "
                                      f"input {k} has {len(ids)} tokens. Please reduce the length of the input.",
                                      "input", "context_length_exceeded")
            now = g.clock.now()
            sid = g.new_id("embd")
            for k, ids in enumerate(inputs):
                hashes = g.hashes(ids, req.cache_salt, req.model)
                sim = SimRequest(req_id=f"{sid}-{k}", prompt_len=len(ids), max_output=1, block_hashes=hashes,
                                 priority=req.priority, arrival=now)
                job = Job(sim=sim, gen=Generation([""], "stop", ""), arrival=now, prompt=k)
                g.runner.submit(job)
                jobs.append(job)
            for job in jobs:
                await g.runner.wait(job, 0)  # its prefill is done once the engine produced its (only) token
                if not job.produced:
                    raise ApiError(500, "The engine aborted the request.", "server_error", None, "aborted")
            data = []
            for k, ids in enumerate(inputs):
                v = self.vector(ids, dims)
                emb = base64.b64encode(v.astype("<f4").tobytes()).decode() if req.encoding_format == "base64" \
                    else v.tolist()
                data.append({"object": "embedding", "index": k, "embedding": emb})
            tokens = sum(len(ids) for ids in inputs)
            request.respond(200, orjson.dumps({"object": "list", "data": data, "model": req.model, "usage": {
                "prompt_tokens": tokens, "total_tokens": tokens}}))
        except ApiError as e:
            request.respond(e.status, e.body(), extra=e.header_lines())
        finally:
            for job in jobs:
                if not job.done:
                    g.runner.cancel(job)
