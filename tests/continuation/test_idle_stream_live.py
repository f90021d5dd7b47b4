"""A stream whose engine freezes mid-way (nothing ejects it: no request there awaits a first token)
continues on another replica after ``stream_idle_timeout_s`` with no event, token for token."""

from __future__ import annotations

from steersman.enginesim.faults import FaultSpec
from steersman.testing import LiveFleet

from cont_streams import Seen, migrations, sims

MODEL = "llama-3.1-8b"
IDLE_S = 0.4


def _stream(client, on_piece=None) -> Seen:
    s = Seen()
    for ch in client.chat.completions.create(stream=True, model=MODEL, max_tokens=60,
                                             messages=[{"role": "user", "content": "Tell me about replicas."}]):
        s.heads.add((ch.id, ch.created, ch.model))
        for c in ch.choices:
            if c.delta.content:
                s.pieces.append(c.delta.content)
                if on_piece is not None:
                    on_piece(len(s.pieces))
            if c.finish_reason is not None:
                s.finish = c.finish_reason
    return s


def test_a_frozen_stream_continues_elsewhere_after_the_idle_timeout(openai_client):
    # real-time engines (speedup 1): ~8 ms a token, so the stream is under way when its engine freezes
    with LiveFleet(sims=sims(2, speedup=1.0), policy="round-robin",
                   extra={"reliability": {"stream_idle_timeout_s": IDLE_S}}) as lf:
        client = openai_client(lf.url)
        ref = _stream(client)  # engine-sim's text is a function of the context: any replica gives the same
        assert len(ref.pieces) > 20
        frozen = []

        def freeze(k: int) -> None:
            if k == 2:
                async def f():  # the replica streaming it now
                    sim = next(s for s in lf.sims if s.runner.jobs)
                    sim.faults.apply(FaultSpec(hang=True))
                    frozen.append(sim)
                lf.call(f)

        got = _stream(client, freeze)  # its engine freezes after 2 tokens; nothing else is there to eject it
        assert frozen
        lf.call(_unfreeze, frozen[0])
        assert got.pieces == ref.pieces and got.finish == ref.finish  # nothing lost, nothing twice
        assert len(got.heads) == 1
        assert migrations(lf.url) == 1
        counts = lf.call(_counts, lf.gateway)
        assert counts.get(("stream_idle",), 0) == 1 and counts.get(("continued",), 0) == 1, counts


async def _unfreeze(sim):
    sim.faults.apply(FaultSpec())


async def _counts(gw):
    return dict(gw.pipeline.retrier.counts.values)
