"""A registry of an extension point checks what its factories make implements the point's Protocol: a scorer
registered as a filter built from the fleet file and failed at the first request (architecture audit,
thirty-fifth session); now the file is refused, naming it and what it lacks."""

import numpy as np
import pytest

from steersman.fleet.config import FleetConfigError, parse_fleet
from steersman.plugins import Registry
from steersman.policy.framework import FILTERS, Filter


class _ScoreOnly:
    name = "score-only"

    def score(self, ctx):
        return np.ones(len(ctx.candidates))


def test_a_plugin_registered_as_the_wrong_extension_point_is_refused_where_the_file_names_it():
    FILTERS.register("score-only", _ScoreOnly)
    try:
        doc = {"endpoints": [{"url": "http://127.0.0.1:1", "models": ["m"]}], "policy": "mine",
               "scheduler": {"profiles": {"mine": {"filters": ["score-only"], "scorers": ["load-balance"],
                                                    "picker": "max-score"}}}}
        with pytest.raises(FleetConfigError, match=r"scheduler\.profiles\.mine\.filters\[0\] \(score-only\): _ScoreOnly "
                                                   r"does not implement Filter \(it has no filter\)"):
            parse_fleet(doc)
    finally:
        FILTERS._items.pop("score-only")


def test_build_checks_and_a_registry_without_a_protocol_takes_anything():
    reg = Registry("thing", Filter)
    reg.register("bad", _ScoreOnly)
    with pytest.raises(TypeError, match="thing 'bad': _ScoreOnly does not implement Filter"):
        reg.build("bad")
    loose = Registry("thing")
    loose.register("any", _ScoreOnly)
    assert isinstance(loose.build("any"), _ScoreOnly)
