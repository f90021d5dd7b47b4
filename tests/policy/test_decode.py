"""The decode picker: where a disaggregated request's KV goes, as a pure function of the fleet snapshot."""

from dataclasses import replace

import numpy as np
import pytest

from steersman.fleet.config import FleetConfigError, parse_fleet
from steersman.policy.base import Reject, Route
from steersman.policy.decode import DECODE_PICKERS, DecodePicker, decode_model, make_decode_picker
from steersman.plugins import UnknownPlugin
from steersman.testing.snapshots import MODEL, fleet_snapshot, sched_request

PREFILL = 0  # replicas 0-1 serve the model (prefill); 2-4 are its decode replicas


def _snap(in_flight, routable=None, blocked_until=None, time=10.0):
    snap = fleet_snapshot(5, in_flight=in_flight, routable=routable, time=time)
    masks = {MODEL: np.array([1, 1, 0, 0, 0], dtype=bool), decode_model(MODEL): np.array([0, 0, 1, 1, 1], dtype=bool)}
    return replace(snap, model_masks=masks, blocked_until=None if blocked_until is None else np.asarray(blocked_until, float))


def _pick(snap, model=MODEL):
    return make_decode_picker("least-loaded").pick_decode(snap, sched_request(model=model), PREFILL)


def test_the_least_loaded_decode_replica_lowest_index_on_ties():
    assert isinstance(make_decode_picker("least-loaded"), DecodePicker)
    d = _pick(_snap([9, 9, 3, 1, 2]))
    assert isinstance(d, Route) and d.replica == 3 and "1" in d.reason
    assert _pick(_snap([0, 0, 2, 1, 1])).replica == 3  # a tie: the lowest index
    # the prefill replicas' load does not count: they are not decode replicas of the model
    assert _pick(_snap([0, 0, 5, 5, 4])).replica == 4


def test_unavailable_decode_replicas_are_skipped():
    assert _pick(_snap([0, 0, 0, 1, 2], routable=[1, 1, 0, 1, 1])).replica == 3  # unhealthy or loading weights
    assert _pick(_snap([0, 0, 0, 1, 2], blocked_until=[0, 0, 11.0, 0, 0])).replica == 3  # ejected until 11 s
    assert _pick(_snap([0, 0, 0, 1, 2], blocked_until=[0, 0, 11.0, 11.0, 0])).replica == 4
    assert _pick(_snap([0, 0, 0, 1, 2], blocked_until=[0, 0, 9.0, 11.0, 0])).replica == 2  # its ejection ended


def test_every_decode_replica_out_of_rotation_is_panic_not_an_outage():
    """The guard has ejected (or opened the breaker of) every decode replica of the model: they take the hand-off
    anyway, the least loaded first, as the routing gate's panic mode does (a blip of the guard's making must not
    fail every disaggregated request); an unroutable one (down, weights loading) still never does."""
    d = _pick(_snap([0, 0, 3, 1, 2], blocked_until=[0, 0, 11.0, 11.0, np.inf]))
    assert isinstance(d, Route) and d.replica == 3
    d = _pick(_snap([0, 0, 3, 1, 2], routable=[1, 1, 1, 0, 1], blocked_until=[0, 0, 11.0, 11.0, 11.0]))
    assert isinstance(d, Route) and d.replica == 4
    # one still in rotation: only it, however loaded
    assert _pick(_snap([0, 0, 3, 1, 9], blocked_until=[0, 0, 11.0, 11.0, 0])).replica == 4
    d = _pick(_snap([0] * 5, routable=[1, 1, 0, 0, 0], blocked_until=[0, 0, 11.0, 11.0, 11.0]))
    assert isinstance(d, Reject) and d.retry_after is None  # none routable: nothing to panic to (the wait: the plane's)


def test_no_decode_replica_is_a_reject_naming_the_model():
    d = _pick(_snap([0] * 5, routable=[1, 1, 0, 0, 0]))
    assert isinstance(d, Reject) and MODEL in d.reason and d.retry_after is None
    d = _pick(_snap([0] * 5), model="qwen2.5-7b")
    assert isinstance(d, Reject) and "qwen2.5-7b" in d.reason and d.code == "no_decode_replica"


def test_pickers_are_named_and_configured_from_the_fleet_file():
    assert "least-loaded" in DECODE_PICKERS.names()
    with pytest.raises(UnknownPlugin, match="least-loaded"):
        make_decode_picker("nearest")
    cfg = parse_fleet({"scheduler": {"decode_picker": "least-loaded"}, "simulated": {"replicas": [{"gpu": "H100", "model": MODEL}]}})
    assert cfg.scheduler.decode_picker == "least-loaded"
    with pytest.raises(FleetConfigError, match=r"scheduler\.decode_picker 'nearest'; known: least-loaded"):
        parse_fleet({"scheduler": {"decode_picker": "nearest"}, "simulated": {"replicas": [{"gpu": "H100", "model": MODEL}]}})
