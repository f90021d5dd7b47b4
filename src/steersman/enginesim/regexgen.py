"""A string a regular expression matches whole, for engine-sim's ``guided_regex`` (vLLM's guided decoding by
regular expression): walked from Python's own parse of the pattern (``re._parser``), choices drawn from a seeded
``random.Random`` so the text is a function of the request's context, as engine-sim's other outputs are.

Covered: literals, ``.``, classes (ranges, ``\\d \\w \\s`` and their negations, negated classes), every repeat
(unbounded ones drawn up to 3 past their minimum), alternation, groups and back-references, case-insensitive
flags; anchors add nothing.  A pattern whose draw does not match in a few tries (lookarounds, word boundaries
that a draw breaks) gives ``None``: the caller refuses the request rather than send text that does not match.
"""

from __future__ import annotations

import random
import re
import string
import warnings
from re import _constants as C  # type: ignore[attr-defined]
from re import _parser as P  # type: ignore[attr-defined]

__all__ = ["regex_sample"]

_EXTRA = 3  # an unbounded repeat is drawn from [min, min + 3]
_TRIES = 8
_MAX_CHARS = 65_536  # a draw longer than this is refused (``(a{60000}){60000}`` would need 3.6 GB)
_POOL = string.ascii_lowercase + string.digits + " " + string.ascii_uppercase + "-_.,"
_CATEGORY = {
    C.CATEGORY_DIGIT: string.digits, C.CATEGORY_WORD: string.ascii_letters + string.digits + "_",
    C.CATEGORY_SPACE: " ", C.CATEGORY_NOT_DIGIT: string.ascii_letters, C.CATEGORY_NOT_WORD: " -.,",
    C.CATEGORY_NOT_SPACE: string.ascii_letters + string.digits,
}


def regex_sample(pattern: str, rng: random.Random) -> str | None:
    """A string ``re.fullmatch(pattern, s)`` accepts, or ``None`` (an invalid pattern raises ``re.error``)."""
    with warnings.catch_warnings():  # "possible nested set" and the like: advice for the pattern's author
        warnings.simplefilter("ignore", FutureWarning)
        compiled = re.compile(pattern)
        tree = P.parse(pattern)
    for _ in range(_TRIES):
        try:
            text = _emit(tree, rng, {})
        except (_Unsupported, RecursionError):
            return None
        if compiled.fullmatch(text):
            return text
    return None


class _Unsupported(Exception):
    """A construct the draw does not cover, or a draw longer than ``_MAX_CHARS``."""


def _emit(items, rng: random.Random, groups: dict[int, str]) -> str:
    text = "".join(_one(op, av, rng, groups) for op, av in items)
    if len(text) > _MAX_CHARS:
        raise _Unsupported("longer than _MAX_CHARS")
    return text


def _one(op, av, rng: random.Random, groups: dict[int, str]) -> str:
    if op is C.LITERAL:
        return chr(av)
    if op is C.NOT_LITERAL:
        return next(c for c in _POOL if ord(c) != av)
    if op is C.ANY:
        return rng.choice(string.ascii_lowercase)
    if op is C.IN:
        return _in_class(av, rng)
    if op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
        lo, hi, sub = av
        hi = lo + _EXTRA if hi is C.MAXREPEAT else min(hi, lo + _EXTRA)
        parts, size = [], 0
        for _ in range(rng.randint(lo, hi)):
            parts.append(_emit(sub, rng, groups))
            size += len(parts[-1])
            if size > _MAX_CHARS:
                raise _Unsupported("longer than _MAX_CHARS")
        return "".join(parts)
    if op is C.BRANCH:
        return _emit(rng.choice(av[1]), rng, groups)
    if op is C.SUBPATTERN:
        group, _, _, sub = av
        text = _emit(sub, rng, groups)
        if group is not None:
            groups[group] = text
        return text
    if op is C.ATOMIC_GROUP:
        return _emit(av, rng, groups)
    if op is C.GROUPREF:
        return groups.get(av, "")
    if op is C.CATEGORY:
        return rng.choice(_category(av))
    if op in (C.AT, C.ASSERT, C.ASSERT_NOT):
        return ""  # anchors and lookarounds consume nothing; fullmatch judges the draw
    raise _Unsupported(str(op))


def _category(av) -> str:
    chars = _CATEGORY.get(av)
    if chars is None:
        raise _Unsupported(str(av))
    return chars


def _in_class(items, rng: random.Random) -> str:
    negate = bool(items) and items[0][0] is C.NEGATE
    allowed: list[str] = []
    for op, av in items[1:] if negate else items:
        if op is C.LITERAL:
            allowed.append(chr(av))
        elif op is C.RANGE:
            lo, hi = av
            allowed.extend(chr(c) for c in range(lo, min(hi, lo + 95) + 1))
        elif op is C.CATEGORY:
            allowed.extend(_category(av))
        else:
            raise _Unsupported(str(op))
    if negate:
        banned = set(allowed)
        allowed = [c for c in _POOL if c not in banned]
        if not allowed:
            raise _Unsupported("a negated class bans every candidate")
    return rng.choice(allowed)
