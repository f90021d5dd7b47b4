"""Brown-out: sheddable traffic moves to a cheaper model or is refused while the gateway queue is deep."""

from dataclasses import replace
from types import MappingProxyType

from steersman.config import DEFAULTS
from steersman.policy import PriorityClass
from steersman.reliability import Keep, MoveTo, Shed, brownout
from steersman.reliability.brownout import BrownoutState, browned_out, leave_depth

S = replace(DEFAULTS.reliability, brownout_models=MappingProxyType({"big": "small"}))


def _do(priority, depth, saturated=(), served=("big", "small"), s=S, model="big", movable=True, **kw):
    return brownout(priority, model, depth, lambda m: m in saturated, lambda m: m in served, s, movable, **kw)


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


def test_brownout_begins_at_the_depth_with_the_model_full_and_ends_below_the_band_after_the_window():
    """Hysteresis: begins at ``brownout_queue_depth`` (only with every replica full), goes on while the backlog is
    at least ``brownout_leave_fraction`` of it (the replicas' room no longer asked), ends once it has been below
    that for ``brownout_stabilization_s``."""
    enter, window = S.brownout_queue_depth, S.brownout_stabilization_s
    low = leave_depth(S)
    assert low == enter * S.brownout_leave_fraction < enter
    asked = []

    def full(answer):
        return lambda: asked.append(answer) or answer

    assert browned_out(None, enter - 1, full(True), 0.0, S) is None
    assert browned_out(None, enter, full(False), 0.0, S) is None
    on = browned_out(None, enter, full(True), 5.0, S)
    assert on == BrownoutState(5.0, 5.0)
    asked.clear()
    for t, depth in enumerate((enter - 1, int(low), enter, int(low)), start=6):  # hovering in the band: stays on
        on = browned_out(on, depth, full(False), float(t), S)
        assert on == BrownoutState(5.0, float(t))
    assert not asked  # in brown-out, a replica's room does not end it: the backlog takes it
    short = int(low) - 1
    assert browned_out(on, short, full(False), 9.0 + window - 0.001, S) == on  # the window's tail
    assert browned_out(on, short, full(False), 9.0 + window, S) is None
    assert browned_out(None, enter - 1, full(True), 9.0 + window, S) is None  # begins again only at the depth


def test_without_a_window_and_with_no_band_it_is_the_one_threshold():
    one = replace(S, brownout_leave_fraction=1.0, brownout_stabilization_s=0.0)
    on = browned_out(None, one.brownout_queue_depth, lambda: True, 0.0, one)
    assert on is not None
    assert browned_out(on, one.brownout_queue_depth - 1, lambda: True, 0.0, one) is None


def test_in_brownout_the_action_reads_the_state_and_sheds_only_with_a_backlog():
    low = int(leave_depth(S))
    assert _do(PriorityClass.SHEDDABLE, low, on=True) == MoveTo("small")  # below the depth: the state decides
    assert isinstance(_do(PriorityClass.SHEDDABLE, 10_000, on=False), Keep)
    assert isinstance(_do(PriorityClass.SHEDDABLE, low, on=True, saturated=("small",)), Shed)  # a backlog: shed
    # the window's tail (backlog below the band): nothing is shed, there is no queue place to protect
    assert isinstance(_do(PriorityClass.SHEDDABLE, low - 1, on=True, saturated=("small",)), Keep)
    assert isinstance(_do(PriorityClass.SHEDDABLE, low - 1, on=True, movable=False), Keep)


def test_a_request_the_cheaper_model_cannot_hold_is_not_moved_but_shed():
    """Moved, routing would refuse it with a 400 ``context_length_exceeded`` for a model it never asked for; kept,
    the heaviest sheddable requests would take the saturated queue's places: shed, as any that cannot move (kept
    in the stabilization window's tail, where the backlog is short)."""
    assert isinstance(_do(PriorityClass.SHEDDABLE, 100, holds=lambda m: m != "small"), Shed)
    low = int(S.brownout_queue_depth * S.brownout_leave_fraction)
    assert isinstance(_do(PriorityClass.SHEDDABLE, low - 1, on=True, holds=lambda m: m != "small"), Keep)
    assert _do(PriorityClass.SHEDDABLE, 100, holds=lambda m: True) == MoveTo("small")
    assert isinstance(_do(PriorityClass.SHEDDABLE, 100, holds=lambda m: False, movable=False), Shed)
