"""The brown-out stage over a real fleet snapshot and an injected clock: hysteresis (a backlog hovering at the
threshold does not flip a model's sheddable traffic between models request by request) and a moved request's
scheduling context (the cheaper model's, and only when the cheaper model can hold the request at all)."""

from dataclasses import replace
from types import MappingProxyType, SimpleNamespace

import msgspec
import numpy as np
from prometheus_client import CollectorRegistry

from steersman.api.prompt import batch_shape
from steersman.api.schema import ChatCompletionRequest
from steersman.config import DEFAULTS
from steersman.engines.base import EngineMetrics
from steersman.fleet.state import Fleet, Replica
from steersman.pipeline.brownout import Brownout
from steersman.pipeline.context import RequestContext
from steersman.pipeline.outcome import Fail
from steersman.policy import PriorityClass
from steersman.policy.request import SchedRequest
from steersman.policy.scorers import kv_shortfall
from steersman.testing import FakeClock

BIG, SMALL = "big", "small"
REL = replace(DEFAULTS.reliability, brownout_models=MappingProxyType({BIG: SMALL}))
ENTER = REL.brownout_queue_depth
SAT = DEFAULTS.scheduler.saturation_queue_depth
#: what each model's answers have been, in output tokens (the gateway's running estimate, per model and tenant)
OUTPUTS = {BIG: 400, SMALL: 90}


class _Gateway:
    """What the stage reads of the gateway: its settings, the per-model backlog, the fleet, the clock."""

    def __init__(self, small_kv_blocks: float | None = None, rel=REL) -> None:
        self.clock = FakeClock(start=10.0)
        reps = [Replica(0, "r0", "http://127.0.0.1:9000", "openai", "H100", (BIG,), "p", 2.0, 1, None),
                Replica(1, "r1", "http://127.0.0.1:9001", "openai", "H100", (SMALL,), "p", 1.0, 1, None)]
        self.fleet = Fleet(reps, self.clock, DEFAULTS.scheduler)
        self.fleet.update_metrics(1, EngineMetrics(0, 0, 0.0, kv_blocks_total=small_kv_blocks))
        self.big_full(True)
        self.cfg = SimpleNamespace(reliability=rel)
        self.scheduler_settings = DEFAULTS.scheduler
        self.metrics = SimpleNamespace(registry=CollectorRegistry())
        self.backlog = {BIG: 0, SMALL: 0}
        self.plane = SimpleNamespace(waiting_for=lambda m: self.backlog.get(m, 0), settings=DEFAULTS.scheduler)

    def big_full(self, full: bool) -> None:
        """The big model's replica saturated by its own report (a queue past the saturation depth), or not."""
        self.fleet.update_metrics(0, EngineMetrics(32, SAT + 1 if full else 0, 0.1))

    def expected_output(self, model, tenant=None, max_tokens=None):
        n = OUTPUTS[model]
        return n if max_tokens is None else min(n, max_tokens)


def _ctx(gw, text="hello", seq=1, max_tokens=None):
    body = {"model": BIG, "messages": [{"role": "user", "content": text}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    raw = msgspec.json.encode(body)
    req = msgspec.json.decode(raw, type=ChatCompletionRequest)
    tokens, hashes, longest = batch_shape(req, DEFAULTS.engine.block_size)
    sched = SchedRequest(seq=seq, model=BIG, kind="chat", stream=False, tenant="cheap",
                         priority=PriorityClass.SHEDDABLE, arrival=gw.clock.now(), prompt_tokens=tokens,
                         block_hashes=hashes, max_tokens=req.output_limit,
                         expected_output=gw.expected_output(BIG, "cheap", req.output_limit),
                         longest_prompt_tokens=longest)
    http = SimpleNamespace(body=raw, extra_headers=b"", headers={})
    return RequestContext(http=http, kind="chat", path="/v1/chat/completions", seq=seq, started=gw.clock.now(),
                          request=req, model=BIG, requested_model=BIG, tenant=SimpleNamespace(name="cheap"),
                          sched=sched)


async def _served_by(stage, gw, seq, **kw) -> str:
    """The model a sheddable request for the big model is left on by the stage ("shed" when refused)."""
    ctx = _ctx(gw, seq=seq, **kw)
    out = await stage.run(ctx)
    if isinstance(out, Fail):
        return "shed"
    assert ctx.sched.model == ctx.model and msgspec.json.decode(ctx.body)["model"] == ctx.model
    return ctx.model


async def test_a_backlog_hovering_at_the_threshold_does_not_flip_the_model_request_by_request():
    """The big model's backlog goes 64, 63, 64, 63 ... (requests leave and arrive around the threshold), its
    replica full: one threshold moved every other request of a conversation to the small model (each turn on
    another model, neither's prefix cache warm).  Brown-out begins at the threshold and ends only once the backlog
    is below the leave depth (half of it) and has stayed there for the stabilization window."""
    gw = _Gateway()
    stage = Brownout(gw)
    served = []
    for i in range(8):
        gw.backlog[BIG] = ENTER if i % 2 == 0 else ENTER - 1
        served.append(await _served_by(stage, gw, i))
        await gw.clock.advance(1.0)
    assert served == [SMALL] * 8
    # the backlog drains, but not below the leave depth: still browned out, even while its replica has room
    gw.big_full(False)
    gw.backlog[BIG] = int(np.ceil(ENTER * REL.brownout_leave_fraction))
    assert await _served_by(stage, gw, 10) == SMALL
    # below the leave depth: still the small model until the window has passed since the backlog was last deep
    gw.backlog[BIG] = int(np.ceil(ENTER * REL.brownout_leave_fraction)) - 1
    await gw.clock.advance(REL.brownout_stabilization_s / 2)
    assert await _served_by(stage, gw, 11) == SMALL
    await gw.clock.advance(REL.brownout_stabilization_s / 2)
    assert await _served_by(stage, gw, 12) == BIG
    assert await _served_by(stage, gw, 13) == BIG  # over: a deep backlog with a full replica begins it again
    assert stage.counts.get(BIG, "moved") == 10


async def test_a_replica_freeing_a_slot_for_an_instant_does_not_end_the_brownout():
    """With 64 requests waiting for the big model, a slot its replica frees goes to one of them: the sheddable
    request arriving in that instant still moves (it was kept on the big model, to wait behind the 64)."""
    gw = _Gateway()
    stage = Brownout(gw)
    gw.backlog[BIG] = ENTER
    served = []
    for i in range(6):
        gw.big_full(i % 2 == 0)
        served.append(await _served_by(stage, gw, i))
        await gw.clock.advance(0.1)
    assert served == [SMALL] * 6


async def test_the_threshold_alone_does_not_begin_a_brownout_while_the_model_has_room():
    gw = _Gateway()
    stage = Brownout(gw)
    gw.big_full(False)
    gw.backlog[BIG] = 10 * ENTER
    assert await _served_by(stage, gw, 1) == BIG
    gw.backlog[BIG] = ENTER - 1
    gw.big_full(True)
    assert await _served_by(stage, gw, 2) == BIG


async def test_a_moved_request_is_scheduled_as_the_cheaper_models():
    """The scheduling context of a moved request is the one ``describe`` builds for the small model: the same
    prompt shape (the gateway tokenizes and renders every model's prompt alike: ``steersman.text``), and the small
    model's expected output, not the big one's (it sizes the KV the request will hold and its predicted latency)."""
    gw = _Gateway()
    stage = Brownout(gw)
    gw.backlog[BIG] = ENTER
    ctx = _ctx(gw, text="a question " * 50)
    before = ctx.sched
    await stage.run(ctx)
    assert ctx.model == SMALL
    tokens, hashes, longest = batch_shape(ctx.request, DEFAULTS.engine.block_size)
    assert ctx.request.model == SMALL
    assert ctx.sched == replace(before, model=SMALL, prompt_tokens=tokens, block_hashes=hashes,
                                longest_prompt_tokens=longest,
                                expected_output=gw.expected_output(SMALL, "cheap", ctx.request.output_limit))
    assert ctx.sched.expected_output == OUTPUTS[SMALL]


async def test_a_request_too_long_for_the_cheaper_model_is_not_moved_but_shed():
    """The small model's replica holds 64 blocks (1,024 tokens) in all; a ~2,000-token prompt fits the big one.
    Moved, routing would refuse it with a 400 ``context_length_exceeded`` naming ``messages`` (for the small
    model): a load decision failing a request the model asked for serves.  It is not moved: sheddable work that
    cannot step aside, it gets the brown-out's 503 (with Retry-After) as without a cheaper model; a short one
    still moves."""
    gw = _Gateway(small_kv_blocks=64)
    stage = Brownout(gw)
    gw.backlog[BIG] = ENTER
    long_ctx = _ctx(gw, text="word " * 2000, max_tokens=16)
    assert long_ctx.sched.prompt_tokens + 16 > 64 * DEFAULTS.engine.block_size
    moved = replace(long_ctx.sched, model=SMALL)  # what the stage's rewrite would route
    refusal = kv_shortfall(gw.fleet.snapshot(), moved, np.array([1]))
    assert refusal.status == 400 and refusal.code == "context_length_exceeded"
    out = await stage.run(long_ctx)
    assert isinstance(out, Fail) and out.error.status == 503 and out.error.code == "brownout"
    assert long_ctx.model == BIG and long_ctx.sched.model == BIG and b'"model":"big"' in long_ctx.body
    assert long_ctx.http.extra_headers == b""
    assert await _served_by(stage, gw, 2, max_tokens=16) == SMALL
    assert stage.counts.get(BIG, "moved") == 1 and stage.counts.get(BIG, "shed") == 1


async def test_a_request_moved_to_a_lora_adapter_is_keyed_as_the_adapters():
    """The cheaper model is a LoRA adapter on the small replica (its KV its own): the moved request's block hashes
    are the ones ``describe`` gives a request for the adapter (steersman.text.lora), not the big model's."""
    from steersman.text.lora import lora_key, rekeyed

    gw = _Gateway()
    gw.fleet.set_models(1, (SMALL,), (SMALL,))
    assert dict(gw.fleet.lora_keys) == {SMALL: lora_key(SMALL)}
    stage = Brownout(gw)
    gw.backlog[BIG] = ENTER
    ctx = _ctx(gw, text="a question " * 50)
    base = ctx.sched.block_hashes
    await stage.run(ctx)
    assert ctx.model == SMALL and ctx.sched.block_hashes == rekeyed(base, lora_key(SMALL)) != base
