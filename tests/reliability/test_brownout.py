"""Brown-out: sheddable traffic moves to a cheaper model or is refused while the gateway queue is deep."""

from dataclasses import replace
from types import MappingProxyType

from steersman.config import DEFAULTS
from steersman.policy import PriorityClass
from steersman.reliability import Keep, MoveTo, Shed, brownout

S = replace(DEFAULTS.reliability, brownout_models=MappingProxyType({"big": "small"}))


def _do(priority, depth, saturated=(), served=("big", "small"), s=S, model="big", movable=True):
    return brownout(priority, model, depth, lambda m: m in saturated, lambda m: m in served, s, movable)


def test_only_sheddable_traffic_and_only_with_a_deep_queue():
    for p in (PriorityClass.CRITICAL, PriorityClass.STANDARD, PriorityClass.BATCH):
        assert isinstance(_do(p, 10_000), Keep)
    assert isinstance(_do(PriorityClass.SHEDDABLE, S.brownout_queue_depth - 1), Keep)
    assert _do(PriorityClass.SHEDDABLE, S.brownout_queue_depth) == MoveTo("small")


def test_refused_when_no_cheaper_model_can_take_it():
    assert isinstance(_do(PriorityClass.SHEDDABLE, 100, saturated=("small",)), Shed)
    assert isinstance(_do(PriorityClass.SHEDDABLE, 100, served=("big",)), Shed)
    assert isinstance(_do(PriorityClass.SHEDDABLE, 100, s=DEFAULTS.reliability), Shed)
    assert isinstance(_do(PriorityClass.SHEDDABLE, 100, model="small"), Shed)


def test_a_request_that_cannot_move_is_shed_instead():
    """An embedding: another model's vectors are not comparable, so brown-out sheds it where it would move it."""
    assert isinstance(_do(PriorityClass.SHEDDABLE, 100, movable=False), Shed)
    assert isinstance(_do(PriorityClass.SHEDDABLE, 0, movable=False), Keep)
