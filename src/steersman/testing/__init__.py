"""Public test doubles: a fake clock, a scripted engine with faults, and live fleets.

``LiveFleet`` runs engine-sim replicas and a gateway on real 127.0.0.1 sockets in
a background thread, so synchronous clients (the official ``openai`` SDK) can
talk to them from a test.  ``ReplayWorkload`` feeds the twin a fixed list of arrivals.
"""

from steersman.testing.clock import FakeClock
from steersman.testing.keys import tenants_with_keys
from steersman.testing.live import LiveFleet
from steersman.testing.replay import ReplayWorkload, arrival, poisson
from steersman.testing.scripted import Script, ScriptedEngine

__all__ = ["FakeClock", "LiveFleet", "ReplayWorkload", "Script", "ScriptedEngine", "arrival", "poisson", "tenants_with_keys"]
