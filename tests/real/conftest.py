"""A module-scoped pair of real llama-server replicas (see realhelpers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from realhelpers import start_fleet, stop_fleet

from steersman.fleet.processes import LlamaServerFleet


@pytest.fixture(scope="module")
def engines() -> Iterator[LlamaServerFleet]:
    """Two llama-server replicas for a test module (stopped after it)."""
    f = start_fleet(2)
    try:
        yield f
    finally:
        stop_fleet(f)
