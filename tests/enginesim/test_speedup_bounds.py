"""--speedup must be a finite number > 0: NaN or inf would pace nothing and export NaN latencies."""

import math
import subprocess
import sys

import pytest

from steersman.clock import ScaledClock
from steersman.enginesim.app import SimServer, SimServerConfig


@pytest.mark.parametrize("speedup", [math.nan, math.inf, 0.0, -1.0])
def test_scaled_clock_and_sim_server_refuse_a_speedup_that_is_not_finite_and_positive(speedup):
    with pytest.raises(ValueError, match="speedup"):
        ScaledClock(speedup)
    with pytest.raises(ValueError, match="speedup"):
        SimServer(SimServerConfig(speedup=speedup, port=0))


def test_engine_sim_command_names_a_nan_speedup_without_a_traceback():
    r = subprocess.run([sys.executable, "-m", "steersman", "engine-sim", "--port", "0", "--speedup", "nan"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "speedup" in r.stderr and "Traceback" not in r.stderr
