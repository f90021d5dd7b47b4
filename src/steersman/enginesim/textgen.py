"""Deterministic pseudo-text, a function of the context like greedy decoding.

Each next piece is chosen from a rolling 64-bit hash of *every* context token
(prompt and output so far), so it depends only on the context: a request whose
prompt is the original prompt plus the text already produced continues with
exactly the pieces the uninterrupted request would have produced.  This is the
property mid-stream failover needs (the reliability work relies on it).

The end of the answer (EOS) comes from the same hash with probability
``1 / mean_output_tokens`` per token, so lengths are geometric with that mean and
also reproducible under continuation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from steersman.text.tokenizer import tokenize

__all__ = ["Generation", "generate", "context_hash"]

_MASK = (1 << 64) - 1
_MUL = 0x100000001B3
_SEED = 0xCBF29CE484222325

_WORDS = (
    "the of and to in is that for it as with was on be by this are from or at an not have "
    "which one can more all were their has but been other when there its will also into than "
    "model token cache batch prefix stream replica request latency budget fleet router queue "
    "policy engine memory compute decode prefill kernel tensor layer weight signal control plane "
    "river mountain garden window yellow quiet gentle simple bright little winter summer "
    "people system number water history process public market energy design network answer"
).split()
_PUNCT = (",", ".", ";", ":")


def _mix(h: int, t: int) -> int:
    return ((h ^ t) * _MUL) & _MASK


def context_hash(token_ids: Sequence[int]) -> int:
    """Rolling hash of a whole context."""
    h = _SEED
    for t in token_ids:
        h = ((h ^ t) * _MUL) & _MASK
    return h


@dataclass(slots=True)
class Generation:
    pieces: list[str]
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    text: str  # what the client sees (stop string removed)


def generate(
    prompt_ids: Sequence[int],
    prompt_tail: str,
    max_tokens: int,
    mean_output_tokens: float,
    ignore_eos: bool = False,
    stop: Sequence[str] = (),
) -> Generation:
    """Generate up to ``max_tokens`` pieces after ``prompt_ids``.

    ``prompt_tail`` is the last character of the context.  After whitespace the
    first word has no leading space, after text it has one, and no punctuation
    follows punctuation or whitespace; deciding this from the context (not from
    the output position) keeps a continuation identical to the original.
    """
    h = context_hash(prompt_ids)
    eos_mod = max(1, int(round(mean_output_tokens)))
    pieces: list[str] = []
    prev_punct = not prompt_tail or prompt_tail.isspace() or prompt_tail in _PUNCT
    need_space = bool(prompt_tail) and not prompt_tail.isspace()
    words = _WORDS
    nwords = len(words)
    for _ in range(max_tokens):
        if not ignore_eos and pieces and (h >> 17) % eos_mod == 0:
            return _finish(pieces, "stop", stop)
        r = h >> 29
        if not prev_punct and r % 9 == 0:
            piece = _PUNCT[(r >> 4) % len(_PUNCT)]
            prev_punct = True
        else:
            w = words[(r >> 8) % nwords]
            piece = (" " + w) if need_space else w
            prev_punct = False
        need_space = True
        pieces.append(piece)
        for t in tokenize(piece):
            h = _mix(h, t)
    return _finish(pieces, "length", stop)


def _finish(pieces: list[str], reason: str, stop: Sequence[str]) -> Generation:
    text = "".join(pieces)
    if stop:
        cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
        if cut >= 0:
            # keep pieces up to the one holding the stop string's first character,
            # that one cut short (possibly to ""): the engine did generate it
            start = 0
            for j, p in enumerate(pieces):
                if start + len(p) > cut:
                    return Generation(pieces[:j] + [p[: cut - start]], "stop", text[:cut])
                start += len(p)
    return Generation(pieces, reason, text)
