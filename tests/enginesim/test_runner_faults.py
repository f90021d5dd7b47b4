"""The engine-sim runner under faults, on a fake clock (no HTTP, no real time)."""

import asyncio

from steersman.enginesim.app import SimServer, SimServerConfig
from steersman.enginesim.faults import FaultSpec
from steersman.enginesim.runner import Job
from steersman.enginesim.textgen import generate
from steersman.sim import SimRequest
from steersman.testing.clock import FakeClock


def _job(clock: FakeClock, name: str, tokens: int) -> Job:
    gen = generate(name, name[-1:], tokens, 211, ignore_eos=True)
    sim = SimRequest(req_id=name, prompt_len=40, max_output=len(gen.pieces), block_hashes=[], arrival=clock.now())
    return Job(sim=sim, gen=gen, arrival=clock.now())


async def _spin(clock: FakeClock, until, limit: int = 2000) -> None:
    """Advance the fake clock step by step (each runner sleep to its deadline) until ``until()``."""
    for _ in range(limit):
        await asyncio.sleep(0)
        if until():
            return
        due = clock.next_deadline()
        if due is not None:
            await clock.advance(max(0.0, due - clock.now()))
    raise AssertionError("condition not reached")


async def test_hang_landing_mid_step_delivers_that_steps_results_once_lifted():
    """A hang that arrives while the step finishing a request is in flight freezes its results; lifting the hang
    delivers them (they were lost: the engine had already let go of the request)."""
    clock = FakeClock()
    srv = SimServer(SimServerConfig(port=0), clock=clock)
    real_step = srv.engine.step
    landed = []

    def step(now, *a, **k):
        res = real_step(now, *a, **k)
        if res is not None and res.finished and not landed:
            landed.append(now)
            srv.faults.apply(FaultSpec(hang=True))  # POST /admin/faults {"hang": true} while the step runs
        return res

    srv.engine.step = step
    srv.runner.start()
    try:
        job = _job(clock, "hang mid step", 3)
        srv.runner.submit(job)
        await _spin(clock, lambda: bool(landed) and clock.next_deadline() is None)  # the step's sleep is over
        assert not job.done  # hung: nothing delivered
        await clock.advance(5.0)  # the hang lasts 5 s (nothing sleeps meanwhile)
        srv.faults.apply(FaultSpec())  # DELETE /admin/faults
        for _ in range(10):
            await asyncio.sleep(0)
        assert job.done and job.produced == 3 and job.finished_at is not None
        assert job.finished_at >= landed[0] + 5.0  # delivered when the hang ended, not before
        assert srv.runner.jobs == {}
    finally:
        await srv.runner.stop()


class _Stream:
    """Stands in for an HttpRequest being streamed to."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.ended = False

    def start_stream(self) -> None:
        pass

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    async def drain(self) -> None:
        pass

    def end_stream(self) -> None:
        self.ended = True


async def test_die_after_tokens_spent_by_another_stream_kills_a_samples_stream_instead_of_spinning():
    """n > 1 (or logprobs) streams: once the die-after budget is spent (another stream spent it, its crash under
    way), a stream with tokens ready dies too; it used to loop without ever yielding (runner.wait returned at once),
    freezing the event loop so the crash never finished."""
    from steersman.enginesim.chunks import ChunkWriter

    clock = FakeClock()
    srv = SimServer(SimServerConfig(port=0), clock=clock)
    gen = srv.generator
    died = []

    async def on_die() -> None:
        died.append(True)

    gen.on_die = on_die
    real_wait, waits = srv.runner.wait, []

    async def wait(job, have):
        waits.append(have)
        if len(waits) > 100:
            raise AssertionError("the stream loop spins: runner.wait returned at once 100 times")
        await real_wait(job, have)

    srv.runner.wait = wait
    jobs = [_job(clock, f"sample {i}", 10) for i in range(2)]
    for job in jobs:
        job.produced = 4  # tokens ready, requests still running
    srv.faults.apply(FaultSpec(die_after_tokens=3))
    assert srv.faults.streamed(3)  # another stream sent the last 3 tokens allowed and is crashing the replica
    stream = _Stream()
    w = ChunkWriter(True, "chatcmpl-x", 0, gen.model_name)
    await asyncio.wait_for(gen._stream_samples(stream, jobs, w, False, None, ["", ""]), 5)
    assert died and not stream.ended
    assert b'"delta":{"content":' not in b"".join(stream.sent)  # no token past the budget


async def test_clearing_a_slowdown_mid_step_ends_that_step_now_not_at_its_slowed_end():
    """DELETE /admin/faults under a large slowdown: the step under way used to keep its end (start + duration x
    slowdown, ~3 model hours here) and nothing was answered until then; it now ends when the fault is cleared."""
    clock = FakeClock()
    srv = SimServer(SimServerConfig(port=0), clock=clock)
    srv.faults.apply(FaultSpec(slowdown=1e6))  # POST /admin/faults {"slowdown": 1e6}
    srv.runner.start()
    try:
        job = _job(clock, "slowed", 2)
        srv.runner.submit(job)
        await _spin(clock, lambda: clock.next_deadline() is not None)  # the first step sleeps to its slowed end
        slowed_end = clock.next_deadline()
        assert slowed_end > 1000.0
        await clock.advance(5.0)
        assert job.produced == 0
        srv.faults.apply(FaultSpec())  # DELETE /admin/faults
        for _ in range(20):  # at most one model second more, in small moves
            await clock.advance(0.05)
            if job.done:
                break
        assert job.done and job.produced == 2
        assert 5.0 <= job.finished_at < 5.5  # ended at the clear (not dated back before it), then plain steps
    finally:
        await srv.runner.stop()


async def test_raising_a_slowdown_mid_step_stretches_that_step_to_the_new_factor():
    """The step's end follows the fault both ways: a larger factor set while a slowed step runs moves its end."""
    clock = FakeClock()
    srv = SimServer(SimServerConfig(port=0), clock=clock)
    srv.faults.apply(FaultSpec(slowdown=10.0))
    srv.runner.start()
    try:
        job = _job(clock, "slowed more", 1)
        srv.runner.submit(job)
        await _spin(clock, lambda: clock.next_deadline() is not None)
        first_end = clock.next_deadline()
        srv.faults.apply(FaultSpec(slowdown=100.0))
        await _spin(clock, lambda: job.done, limit=50)
        assert job.finished_at > 5 * first_end  # ~10x the first end (from a start at 0)
    finally:
        await srv.runner.stop()


def test_a_slowdown_beyond_the_cap_is_refused_naming_it():
    """slowdown: 1e308 was taken and froze the replica for good (its step's end was infinite)."""
    import pytest

    from steersman.enginesim.faults import MAX_SLOWDOWN

    for bad in (1e308, MAX_SLOWDOWN * 2, float("inf")):
        with pytest.raises(ValueError, match="slowdown"):
            FaultSpec(slowdown=bad).validate()
    FaultSpec(slowdown=MAX_SLOWDOWN).validate()
