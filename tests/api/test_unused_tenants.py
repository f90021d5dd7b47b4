"""A fleet file with tenants (their limits, priorities, budgets) but no api_keys runs open: every request is the
open tenant, and the configured tenants apply to nothing.  The gateway said only that it was OPEN (config audit,
thirty-fifth session); it now names the tenants left unused."""

import logging

from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet


def test_tenants_no_api_key_names_are_said_unused_at_start(caplog):
    caplog.set_level(logging.WARNING, logger="steersman")
    extra = {"tenants": {"acme": {"requests_per_minute": 5}, "default": {"priority": "critical"}}}
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], extra=extra):
        pass
    said = [r.getMessage() for r in caplog.records if "no api_keys name them" in r.getMessage()]
    assert len(said) == 1 and "acme" in said[0] and "default" not in said[0].split("are configured")[0], said


def test_a_brownout_target_no_replica_serves_is_said_at_start(caplog):
    """In brown-out, sheddable requests of a model whose cheaper model no replica serves are shed, not moved: said at
    start, once the fleet's models are known (config audit, thirty-fifth session)."""
    caplog.set_level(logging.WARNING, logger="steersman")
    extra = {"reliability": {"brownout_models": {"llama-3.1-8b": "llama-3.2-1b"}}}
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], extra=extra):
        pass
    said = [r.getMessage() for r in caplog.records if "brownout_models maps" in r.getMessage()]
    assert len(said) == 1 and "'llama-3.2-1b', which no replica serves" in said[0], said
