"""The one return contract of a request-path stage: continue, respond, or fail.

A failure says whether it may be retried: ``SAFE`` means nothing reached the
client yet (a retry on another replica is invisible), ``CONTINUE_ONLY`` means
bytes have streamed, so only a continuation of the same stream is allowed, never
a silent restart; ``NEVER`` means the request itself is at fault.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from steersman.api.errors import ApiError

__all__ = ["Retry", "Continue", "Respond", "Fail", "Outcome", "CONTINUE", "RESPONDED"]


class Retry(enum.Enum):
    NEVER = "never"
    SAFE = "safe"
    CONTINUE_ONLY = "continue-only"


@dataclass(frozen=True, slots=True)
class Continue:
    pass


@dataclass(frozen=True, slots=True)
class Respond:
    """The stage answered the client (fully, or a stream it has ended)."""


@dataclass(frozen=True, slots=True)
class Fail:
    error: ApiError
    retry: Retry = Retry.NEVER


Outcome = Continue | Respond | Fail
CONTINUE = Continue()
RESPONDED = Respond()
