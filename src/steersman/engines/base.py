"""The engine adapter extension point: how the gateway talks to one kind of engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["EngineMetrics", "UpstreamError", "UpstreamResponse", "EngineAdapter", "ReplicaAddress"]


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """What the fleet learns from one scrape of an engine's ``/metrics``."""

    num_running: float = 0.0
    num_waiting: float = 0.0
    kv_usage: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    weights: str | None = None  # "cold" | "loading" | "warm" when the engine says


class UpstreamError(Exception):
    """The engine could not be reached or broke the connection.

    ``connected`` is False when nothing reached the engine (connection refused,
    DNS, connect timeout): such a failure is always safe to retry elsewhere.
    """

    def __init__(self, message: str, connected: bool) -> None:
        super().__init__(message)
        self.connected = connected


@runtime_checkable
class UpstreamResponse(Protocol):
    status: int
    headers: Mapping[str, str]

    def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (no buffering)."""
        ...

    async def read(self) -> bytes: ...

    def close(self) -> None:
        """Drop the connection (cancels the request on the engine)."""
        ...

    def release(self) -> None:
        """Return a fully read connection to the pool."""
        ...


@dataclass(frozen=True, slots=True)
class ReplicaAddress:
    name: str
    url: str


@runtime_checkable
class EngineAdapter(Protocol):
    """One per engine kind (``vllm``, ``engine-sim``, ``openai``, ...), registered by name."""

    kind: str

    async def send(self, replica: ReplicaAddress, path: str, body: bytes, headers: Mapping[str, str]) -> UpstreamResponse:
        """POST ``body`` to ``replica``'s ``path``; raises :class:`UpstreamError`."""
        ...

    async def scrape(self, replica: ReplicaAddress) -> EngineMetrics:
        """Read the engine's load metrics; raises :class:`UpstreamError`."""
        ...

    async def list_models(self, replica: ReplicaAddress) -> list[str]: ...

    async def health(self, replica: ReplicaAddress) -> bool: ...

    async def close(self) -> None: ...
