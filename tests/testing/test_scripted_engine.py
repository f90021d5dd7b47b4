"""ScriptedEngine answers as an OpenAI-compatible engine: finish reasons, include_usage, text completions, crashes."""

import httpx
import openai
import pytest

from steersman.testing import LiveFleet, Script, ScriptedEngine

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture()
async def engine():
    e = ScriptedEngine(Script(pieces=("Hello", " world")))
    await e.start()
    client = openai.AsyncOpenAI(base_url=e.url + "/v1", api_key="x", max_retries=0, timeout=10)
    try:
        yield e, client
    finally:
        await client.close()
        await e.stop()


async def _chat_stream(client, **kw):
    finishes, usage, text = [], None, ""
    async for ch in await client.chat.completions.create(model="scripted", messages=MESSAGES, stream=True, **kw):
        for c in ch.choices:
            finishes.append(c.finish_reason)
            text += c.delta.content or ""
        usage = ch.usage or usage
    return text, finishes, usage


async def test_a_chat_stream_ends_with_a_finish_reason_and_a_usage_chunk_when_asked(engine):
    _, client = engine
    text, finishes, usage = await _chat_stream(client, stream_options={"include_usage": True})
    assert text == "Hello world" and finishes == [None, None, "stop"]
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (1, 2, 3)
    text, finishes, usage = await _chat_stream(client)
    assert finishes[-1] == "stop" and usage is None  # no usage chunk unless asked


async def test_max_tokens_cuts_the_answer_with_finish_reason_length(engine):
    _, client = engine
    text, finishes, usage = await _chat_stream(client, max_tokens=1, stream_options={"include_usage": True})
    assert text == "Hello" and finishes[-1] == "length" and usage.completion_tokens == 1
    whole = await client.chat.completions.create(model="scripted", messages=MESSAGES, max_completion_tokens=1)
    assert whole.choices[0].message.content == "Hello" and whole.choices[0].finish_reason == "length"


async def test_text_completions_are_answered_as_text_completions(engine):
    _, client = engine
    whole = await client.completions.create(model="scripted", prompt="hi", max_tokens=5)
    assert whole.object == "text_completion"
    assert whole.choices[0].text == "Hello world" and whole.choices[0].finish_reason == "stop"
    texts, finishes, usage = [], [], None
    async for ch in await client.completions.create(model="scripted", prompt="hi", max_tokens=5, stream=True,
                                                     stream_options={"include_usage": True}):
        assert ch.object == "text_completion"
        texts += [c.text for c in ch.choices]
        finishes += [c.finish_reason for c in ch.choices]
        usage = ch.usage or usage
    assert "".join(texts) == "Hello world" and finishes[-1] == "stop" and usage.completion_tokens == 2


async def test_crash_after_resets_a_whole_answer_and_a_stream_after_its_last_piece(engine):
    e, client = engine
    e.script.crash_after = 0
    with pytest.raises(openai.APIConnectionError):
        await client.chat.completions.create(model="scripted", messages=MESSAGES)
    assert e.seen.completed == 0
    e.script.crash_after = 2  # == the pieces: both go out, then the reset (no finish reason, no [DONE])
    lines = []
    async with httpx.AsyncClient(timeout=10) as h:
        with pytest.raises(httpx.RemoteProtocolError):
            async with h.stream("POST", e.url + "/v1/chat/completions",
                                json={"model": "scripted", "stream": True, "messages": MESSAGES}) as r:
                async for line in r.aiter_lines():
                    lines.append(line)
    data = [x for x in lines if x.startswith("data: ")]
    assert len(data) == 2 and "[DONE]" not in "".join(data) and '"finish_reason":null' in data[-1]
    assert e.seen.completed == 0
    e.script.crash_after = 3  # more than the pieces: the answer was whole before the crash
    text, finishes, _ = await _chat_stream(client)
    assert text == "Hello world" and finishes[-1] == "stop"


def test_through_the_gateway_a_scripted_stream_finishes_and_a_text_completion_has_text():
    with LiveFleet(scripted=[Script(pieces=("a", "b", "c"))], policy="least-request") as lf:
        with openai.OpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0, timeout=20) as c:
            fin = [x.finish_reason for ch in c.chat.completions.create(model="scripted", messages=MESSAGES, stream=True)
                   for x in ch.choices]
            assert fin[-1] == "stop"
            r = c.completions.create(model="scripted", prompt="hi", max_tokens=3)
            assert r.object == "text_completion" and r.choices[0].text == "abc"
