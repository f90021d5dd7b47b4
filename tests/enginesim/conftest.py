import pytest

from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet


@pytest.fixture()
def sim():
    """One engine-sim replica (H100, Llama-3.1-8B, 50x real time), no gateway."""
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], with_gateway=False) as lf:
        yield lf
