"""Log probabilities of engine-sim's pseudo-tokens, in vLLM's (OpenAI's) shapes.

engine-sim decodes greedily (:mod:`steersman.enginesim.textgen`), so the token it emits is the most
likely one: its log probability is the highest of the step, and the ``top_logprobs`` alternatives (other
words of the vocabulary) come after it in decreasing order, the chosen token first.  Every value is a
deterministic function of the token's text and its position, so a request asked twice gets the same
numbers, like greedy decoding on a real engine.  The request decoder bounds the alternatives asked for
(``GatewaySettings.max_logprobs``, vLLM's default 20).
"""

from __future__ import annotations

import zlib

from steersman.enginesim.textgen import _WORDS

__all__ = ["chat_entries", "completion_logprobs"]


def _top(piece: str, position: int, k: int) -> list[tuple[str, float]]:
    """The chosen piece and ``k - 1`` alternatives, most likely first (k >= 1)."""
    h = zlib.crc32(piece.encode("utf-8", "surrogatepass"), position)
    lp = -((h & 0xFFFF) / 0xFFFF) * 1.5  # the greedy choice: -1.5 .. 0
    out = [(piece, round(lp, 6))]
    lead = " " if piece.startswith(" ") else ""
    n = len(_WORDS)
    j = (h >> 16) % n
    for t in range(n):  # the vocabulary from a hashed start: distinct words, at most n of them
        if len(out) >= k:
            break
        word = lead + _WORDS[(j + t) % n]
        if word == piece:
            continue
        lp -= 0.25 + ((h >> (len(out) % 24)) & 0xFF) / 255.0
        out.append((word, round(lp, 6)))
    return out


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", "surrogatepass"))


def chat_entries(pieces: list[str], start: int, top: int) -> list[dict]:
    """``choices[].logprobs.content`` entries of ``pieces`` (the output from position ``start``), with
    ``top`` alternatives each."""
    out = []
    for i, piece in enumerate(pieces, start):
        ranked = _top(piece, i, max(top, 1))
        out.append({
            "token": piece, "logprob": ranked[0][1], "bytes": _bytes(piece),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": _bytes(t)} for t, lp in ranked[:top]],
        })
    return out


def completion_logprobs(pieces: list[str], start: int, top: int, offset: int) -> dict:
    """A completion's ``choices[].logprobs`` for ``pieces`` (from output position ``start``, the first at
    character ``offset`` of the text), with ``top`` alternatives each (vLLM: dicts token -> logprob, the sampled
    token in each, so ``logprobs: 0`` gives it alone)."""
    tokens, lps, tops, offsets = [], [], [], []
    for i, piece in enumerate(pieces, start):
        ranked = _top(piece, i, max(top, 1))
        tokens.append(piece)
        lps.append(ranked[0][1])
        tops.append(dict(ranked))  # vLLM: the sampled token and the ``top`` most likely (one entry when greedy)
        offsets.append(offset)
        offset += len(piece)
    return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}
