"""Kill a replica mid-stream: every stream completes on another replica, token for token.

Live: engine-sim replicas (50x real time) behind the real gateway, the official
``openai`` client.  References are uninterrupted runs of the same requests on the
same fleet before the fault (engine-sim's text is a function of the context, so
any healthy replica gives the same answer).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from steersman.enginesim.faults import FaultSpec
from steersman.testing import LiveFleet

from cont_streams import Seen, chat, completion, migrations, sims

MODEL = "llama-3.1-8b"


def _nested(depth: int) -> list:
    v: list = []
    for _ in range(depth - 1):
        v = [v]
    return v


def _die(lf: LiveFleet, index: int, after: int) -> None:
    async def f():
        lf.sims[index].faults.apply(FaultSpec(die_after_tokens=after))

    lf.call(f)


def _check_same(got: Seen, ref: Seen, include_usage: bool) -> None:
    assert got.pieces == ref.pieces  # no lost, no duplicated, no reordered token
    assert got.finish == ref.finish
    assert len(got.heads) == 1  # one id / created / model in every chunk
    if include_usage:
        assert got.usage is not None and ref.usage is not None
        assert (got.usage.prompt_tokens, got.usage.completion_tokens, got.usage.total_tokens) == (
            ref.usage.prompt_tokens, ref.usage.completion_tokens, ref.usage.total_tokens)
    else:
        assert got.usage is None


def _requests(client, stop_word: str | None):
    msgs = lambda s: [{"role": "user", "content": s}]  # noqa: E731
    calls = [
        ("chat", False, lambda: chat(client, model=MODEL, max_tokens=48, messages=msgs("Tell me about replicas."))),
        ("chat", True, lambda: chat(client, model=MODEL, max_tokens=40, messages=msgs("Explain prefix caching, briefly."),
                                    stream_options={"include_usage": True})),
        ("completion", True, lambda: completion(client, model=MODEL, max_tokens=44, prompt="Once upon a time ",
                                                 stream_options={"include_usage": True})),
        ("completion", False, lambda: completion(client, model=MODEL, max_tokens=36, prompt="The fleet router said")),
    ]
    if stop_word is not None:
        calls.append(("chat", True, lambda: chat(client, model=MODEL, max_tokens=60, messages=msgs("Tell me about replicas."),
                                                 stop=[stop_word], stream_options={"include_usage": True})))
    return calls


def test_kill_a_replica_mid_stream_every_stream_continues_token_exact(openai_client):
    with LiveFleet(sims=sims(3), policy="round-robin") as lf:
        client = openai_client(lf.url)
        base = chat(client, model=MODEL, max_tokens=48, messages=[{"role": "user", "content": "Tell me about replicas."}])
        stop_word = base.pieces[30].strip(" ,.;:") or base.pieces[31].strip(" ,.;:")  # cuts the answer late
        calls = _requests(client, stop_word)
        refs = [fn() for _, _, fn in calls]
        assert refs[-1].finish == "stop" and len(refs[-1].pieces) < 60
        before = migrations(lf.url)
        _die(lf, 0, after=15)  # replica 0 crashes (connections reset, port closed) after 15 more tokens
        with ThreadPoolExecutor(len(calls) * 2) as pool:
            got = list(pool.map(lambda c: c[2](), calls * 2))
        for (kind, usage, _), ref, g in zip(calls * 2, refs * 2, got):
            _check_same(g, ref, usage)
            if kind == "chat":
                assert g.roles == 1  # no second role chunk from the continuation
        assert lf.sims[0].faults.dead
        assert migrations(lf.url) - before >= 1  # streams that had not started there are plain retries


@pytest.mark.parametrize("kind,kw", [
    ("chat", dict(max_tokens=30, messages=[{"role": "user", "content": "One stream, cut early."}],
                  stream_options={"include_usage": True})),
    ("chat", dict(max_tokens=60, messages=[{"role": "user", "content": "Tell me about replicas."}], stop=["yellow"])),
    ("completion", dict(max_tokens=30, prompt="A prompt that ends in whitespace\n\n", stream_options={"include_usage": True})),
    ("completion", dict(max_tokens=30, prompt=["Once upon a time "], stream_options={"include_usage": True})),
    # fields the gateway does not know, which the typed decode accepts and orjson could not read or write again
    # (an integer beyond 64 bits, 300 levels): the continuation ended with an internal error
    ("chat", dict(max_tokens=30, messages=[{"role": "user", "content": "Odd extras."}],
                  extra_body={"zz": 10**30, "deep": _nested(300)})),
    # the engine keeps the prompt's last 12 tokens (its usage counts those: so must the continued stream's)
    ("chat", dict(max_tokens=30, messages=[{"role": "user", "content": "A long question " * 20}],
                  extra_body={"truncate_prompt_tokens": 12}, stream_options={"include_usage": True})),
])
def test_one_stream_migrates_with_exact_tokens_and_usage(openai_client, kind, kw):
    with LiveFleet(sims=sims(2), policy="round-robin") as lf:
        client = openai_client(lf.url)
        run = chat if kind == "chat" else completion
        ref = run(client, model=MODEL, **kw)
        assert len(ref.pieces) > 6
        if "stop" in kw:
            assert ref.finish == "stop" and len(ref.pieces) < kw["max_tokens"]
        _die(lf, 1, after=4)  # round-robin sends this stream to replica 1 (the reference went to 0): it dies after 4 tokens
        first = run(client, model=MODEL, **kw)
        _check_same(first, ref, "stream_options" in kw)
        assert migrations(lf.url) == 1
        if kind == "chat":
            assert first.roles == 1


@pytest.mark.parametrize("kw,reason,sent", [
    ({"response_format": {"type": "json_object"}}, "response_format", 4),
    # the engine sends log probabilities (engine-sim, vLLM's shapes): another replica's would differ after the cut
    ({"logprobs": True}, "logprobs", 4),
    ({"n": 2}, "n > 1", 5),  # two samples side by side: the engine dies after 5 tokens of both together
])
def test_a_stream_that_cannot_be_continued_keeps_its_tokens_and_ends_with_an_error_event(openai_client, kw, reason,
                                                                                          sent):
    with LiveFleet(sims=sims(2), policy="round-robin") as lf:
        client = openai_client(lf.url)
        _die(lf, 0, after=sent)
        _die(lf, 1, after=sent)
        got = []
        with pytest.raises(openai.APIError) as e:
            for c in client.chat.completions.create(model=MODEL, max_tokens=40, stream=True,
                                                    messages=[{"role": "user", "content": "Tell me about replicas."}], **kw):
                got += [ch.delta.content for ch in c.choices if ch.delta.content]
        assert "cannot be continued" in str(e.value) and reason in str(e.value)
        assert len(got) == sent and migrations(lf.url) == 0


def test_engine_dying_after_its_last_token_is_finished_locally(openai_client):
    with LiveFleet(sims=sims(2), policy="round-robin") as lf:
        client = openai_client(lf.url)
        kw = dict(model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "Tell me about replicas."}],
                  stream_options={"include_usage": True})
        ref = chat(client, **kw)
        assert ref.finish == "length" and len(ref.pieces) == 12
        _die(lf, 1, after=12)  # it streams all 12 tokens (the last with finish_reason), then dies before [DONE]
        got = chat(client, **kw)  # (round-robin: to replica 1, the reference went to 0)
        _check_same(got, ref, True)
        assert lf.sims[1].faults.dead and migrations(lf.url) == 0  # nothing left to generate: no new leg


def test_a_tool_call_cut_mid_stream_ends_with_an_error_event_not_a_new_call(openai_client):
    """An agent streaming a tool call from a replica that dies: the arguments so far arrive, then an error event
    saying why the stream cannot be continued; no second call from another replica is spliced in."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"query": {"type": "string", "minLength": 40}}, "required": ["query"]}}}
    with LiveFleet(sims=sims(2), policy="round-robin") as lf:
        client = openai_client(lf.url)
        _die(lf, 0, after=3)
        _die(lf, 1, after=3)
        pieces, ids = [], set()
        with pytest.raises(openai.APIError) as e:
            for c in client.chat.completions.create(model=MODEL, max_tokens=40, stream=True, tools=[tool],
                                                    tool_choice="required",
                                                    messages=[{"role": "user", "content": "Find the replica docs."}]):
                for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
                    if d.id:
                        ids.add(d.id)
                    pieces.append(d.function.arguments or "")
        assert "cannot be continued" in str(e.value) and "tool call" in str(e.value)
        assert len(ids) == 1 and 0 < len("".join(pieces)) and migrations(lf.url) == 0


def test_a_responses_stream_continues_token_exact_on_another_replica(openai_client):
    """/v1/responses runs as a chat stream through the same relay: a replica dying mid-answer is continued, and the
    client reads one Responses stream (no event lost or repeated, one response.completed)."""
    with LiveFleet(sims=sims(2), policy="round-robin") as lf:
        client = openai_client(lf.url)
        kw = dict(model=MODEL, input="Tell me about replicas.", max_output_tokens=30, extra_body={"ignore_eos": True})
        ref = client.responses.create(**kw)
        _die(lf, 1, after=5)  # round-robin sends the stream to replica 1 (the reference went to 0): it dies after 5 tokens
        events = list(client.responses.create(stream=True, **kw))
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert "".join(deltas) == ref.output_text and len(deltas) == 30
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert [e.type for e in events].count("response.created") == 1 and events[-1].type == "response.incomplete"
        assert events[-1].response.usage.output_tokens == 30 and migrations(lf.url) == 1


def test_a_responses_stream_that_cannot_continue_ends_with_error_and_response_failed(openai_client):
    with LiveFleet(sims=sims(2), policy="round-robin") as lf:
        client = openai_client(lf.url)
        _die(lf, 0, after=4)
        _die(lf, 1, after=4)
        events = list(client.responses.create(model=MODEL, input="Tell me about replicas.", max_output_tokens=40,
                                              text={"format": {"type": "json_object"}}, stream=True))
        assert [e.type for e in events][-2:] == ["error", "response.failed"]
        assert "cannot be continued" in events[-2].message and events[-1].response.status == "failed"
        assert migrations(lf.url) == 0


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_a_stop_string_split_by_the_failover_ends_the_stream_as_it_would_have(openai_client, kind):
    """Reliability audit: with ``include_stop_str_in_output`` (vLLM then holds nothing back), the dying replica sent
    the stop string's first word and the new one its second, which it alone could not match: the stream went on 24
    tokens past the stop to max_tokens, finish ``length``."""
    with LiveFleet(sims=sims(2), policy="round-robin") as lf:
        client = openai_client(lf.url)
        run = chat if kind == "chat" else completion
        body = (dict(messages=[{"role": "user", "content": "Describe the river delta."}]) if kind == "chat"
                else dict(prompt="The river delta is"))
        base = run(client, model=MODEL, max_tokens=55, extra_body={"ignore_eos": True}, **body)
        k = next(i for i in range(20, 50) if base.pieces[i].strip() and base.pieces[i + 1].strip()
                 and (base.pieces[i] + base.pieces[i + 1]).strip() not in base.text[: sum(map(len, base.pieces[:i + 1]))])
        stop = (base.pieces[k] + base.pieces[k + 1]).strip()
        kw = dict(model=MODEL, max_tokens=55, stop=[stop], stream_options={"include_usage": True},
                  extra_body={"ignore_eos": True, "include_stop_str_in_output": True}, **body)
        ref = run(client, **kw)  # (round-robin: replica 1 served base, replica 0 this one)
        assert ref.finish == "stop" and ref.text.endswith(stop) and len(ref.pieces) == k + 2
        _die(lf, 0, after=k + 1)  # the stop string's first word is the last token it sends
        got = run(client, **kw)
        assert got.text == ref.text and got.finish == "stop"
        assert got.usage.completion_tokens == ref.usage.completion_tokens
        assert migrations(lf.url) == 1
