"""Deterministic pseudo-text, a function of the context like greedy decoding.

Each next piece is chosen from a rolling hash of the whole context *text*
(prompt and output so far, as UTF-8 bytes), so it depends only on the context: a
request whose prompt is the original prompt plus the text already produced
continues with exactly the pieces the uninterrupted request would have produced,
whatever the tokenizer does at the boundary (a prompt ending in whitespace
tokenizes differently once text follows; hashing tokens would break there).
This is the property mid-stream failover needs (the reliability work relies on
it).  The hash is the context's bytes read as one big-endian integer modulo the
Mersenne prime 2^61-1 (a polynomial hash with base 256), so
``hash(a + b) = hash(a) * 256^len(b) + hash(b)`` and a long prompt costs one
C-level ``int.from_bytes``.  Token-id prompts hash their ids' bytes instead.

The end of the answer (EOS) comes from the same hash with probability
``1 / mean_output_tokens`` per token, so lengths are geometric with that mean and
also reproducible under continuation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Generation", "generate", "context_hash"]

_MASK = (1 << 64) - 1
_P = (1 << 61) - 1
_SHIFT = [pow(256, n, _P) for n in range(64)]

_WORDS = (
    "the of and to in is that for it as with was on be by this are from or at an not have "
    "which one can more all were their has but been other when there its will also into than "
    "model token cache batch prefix stream replica request latency budget fleet router queue "
    "policy engine memory compute decode prefill kernel tensor layer weight signal control plane "
    "river mountain garden window yellow quiet gentle simple bright little winter summer "
    "people system number water history process public market energy design network answer"
).split()
_PUNCT = (",", ".", ";", ":")


def _extend(h: int, data: bytes) -> int:
    """The hash of ``context + data`` from the hash of ``context``."""
    n = len(data)
    shift = _SHIFT[n] if n < 64 else pow(256, n, _P)
    return (h * shift + int.from_bytes(data, "big")) % _P


def context_hash(context: str | Sequence[int]) -> int:
    """Hash of a whole context: its text's UTF-8 bytes, or its token ids' bytes."""
    if isinstance(context, str):
        data = context.encode("utf-8", "surrogatepass")
    else:
        data = b"".join((t & 0xFFFFFFFF).to_bytes(4, "big") for t in context)
    return int.from_bytes(data, "big") % _P


def _scramble(h: int) -> int:
    """splitmix64 finaliser: random-looking bits from the (structured) polynomial hash."""
    z = (h + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


@dataclass(slots=True)
class Generation:
    pieces: list[str]
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    text: str  # what the client sees (stop string removed)


def generate(
    context: str | Sequence[int],
    prompt_tail: str,
    max_tokens: int,
    mean_output_tokens: float,
    ignore_eos: bool = False,
    stop: Sequence[str] = (),
    variant: int = 0,
    min_tokens: int = 0,
    include_stop: bool = False,
) -> Generation:
    """Generate up to ``max_tokens`` pieces after ``context`` (the prompt text, or token ids).

    ``prompt_tail`` is the last character of the context.  After whitespace the
    first word has no leading space, after text it has one, and no punctuation
    follows punctuation or whitespace; deciding this from the context (not from
    the output position) keeps a continuation identical to the original.
    ``variant`` > 0: the request's other samples (``n`` > 1), each its own answer.
    Stop strings end the output as vLLM's do: the text is checked after each token, so the first stop string to
    complete wins and every token up to the one completing it counts; the text ends before it (after it with
    ``include_stop``, vLLM's ``include_stop_str_in_output``).  As vLLM's ``min_tokens``, neither EOS nor a stop
    string ends the output before that many tokens.
    """
    h = context_hash(context)
    if variant:  # another sample of the same request (``n`` > 1): another answer, as reproducible
        h = (h + variant * 0x9E3779B97F4A7C15) % _P
    eos_mod = max(1, int(round(mean_output_tokens)))
    eos_from = max(1, min_tokens)  # EOS never comes first, nor before min_tokens
    pieces: list[str] = []
    text = ""  # the output so far, kept only to check stop strings
    prev_punct = not prompt_tail or prompt_tail.isspace() or prompt_tail in _PUNCT
    need_space = bool(prompt_tail) and not prompt_tail.isspace()
    words = _WORDS
    nwords = len(words)
    for _ in range(max_tokens):
        z = _scramble(h)
        if not ignore_eos and len(pieces) >= eos_from and (z >> 17) % eos_mod == 0:
            return Generation(pieces, "stop", text if stop else "".join(pieces))
        r = z >> 29
        if not prev_punct and r % 9 == 0:
            piece = _PUNCT[(r >> 4) % len(_PUNCT)]
            prev_punct = True
        else:
            w = words[(r >> 8) % nwords]
            piece = (" " + w) if need_space else w
            prev_punct = False
        need_space = True
        pieces.append(piece)
        h = _extend(h, piece.encode())
        if stop:
            text += piece
            if len(pieces) > min_tokens:  # vLLM's detokenizer checks stop strings past min_tokens only
                cut = _stop_at(text, len(piece), stop, include_stop)
                if cut is not None:
                    return _cut(pieces, text, cut)
    return Generation(pieces, "length", text if stop else "".join(pieces))


def _stop_at(text: str, new: int, stop: Sequence[str], include: bool) -> int | None:
    """Where the output ends if the last ``new`` characters of ``text`` complete a stop string (vLLM's
    ``check_stop_strings``: the first in the list that does, searched where it can have just completed), else None."""
    for s in stop:
        i = text.find(s, max(0, len(text) + 1 - new - len(s)))
        if i >= 0:
            return i + len(s) if include else i
    return None


def _cut(pieces: list[str], text: str, cut: int) -> Generation:
    """The output ends at character ``cut``: every token generated counts, the text past ``cut`` is left out (the
    piece holding it cut short, the ones after it empty)."""
    if cut >= len(text):
        return Generation(pieces, "stop", text)
    start, out = 0, []
    for p in pieces:
        out.append(p[: max(0, cut - start)])
        start += len(p)
    return Generation(out, "stop", text[:cut])
