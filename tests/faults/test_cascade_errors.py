"""The cascade drill's load thread: its own error reaches the caller (it was a KeyError('v')), a hang a TimeoutError."""

import threading

import pytest

import steersman.testing.drills as drills


def test_an_error_in_the_cascade_load_is_raised_by_cascade(monkeypatch):
    async def broken_open_loop(*args, **kwargs):
        raise RuntimeError("the gateway refused every client request")

    monkeypatch.setattr(drills, "_capacity", lambda *args, **kwargs: 10.0)  # no 3 s capacity run first
    monkeypatch.setattr(drills, "open_loop", broken_open_loop)
    with pytest.raises(RuntimeError, match="refused every client request"):
        drills.cascade(replicas=1, max_num_seqs=2, before_s=0.05, fault_s=0.05, after_s=0.05)


def test_a_load_still_running_at_the_join_deadline_is_a_timeout():
    release = threading.Event()
    join = drills._background(release.wait)
    try:
        with pytest.raises(TimeoutError):
            join(0.01)
    finally:
        release.set()
    assert join(10) is True
