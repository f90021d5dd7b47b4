"""Bad input gets an OpenAI-format error with the right status, never a 500 or a traceback."""

import httpx
import openai
import pytest

GOOD = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def check(r: httpx.Response, status: int, param: str | None = None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "Traceback" not in err["message"]
    if param is not None:
        assert err["param"] == param and param.split("[")[0].split(".")[0] in err["message"]
    return err


@pytest.mark.parametrize(
    "body,status,param",
    [
        (b"{not json", 400, None),
        (b"", 400, None),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', 400, "model"),
        (b'{"model": "llama-3.1-8b"}', 400, "messages"),
        (b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}', 400, "max_tokens"),
        (b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}', 400, "max_tokens"),
        (b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10000000000}', 400, "max_tokens"),
        (b'{"model": "llama-3.1-8b", "messages": [{"role": 7, "content": "hi"}]}', 400, "messages[0].role"),
        (b'{"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}', 404, "model"),
        (b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {}}]}', 400, "tools[0]"),
        (b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}', 400, "tool_choice"),
        (b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None),
    ],
)
def test_bad_bodies(fleet, body, status, param):
    r = httpx.post(fleet.url + "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    check(r, status, param)


def test_body_over_limit_is_413_whether_declared_or_chunked(fleet):
    big = b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "' + b"x" * 1_200_000 + b'"}]}'
    check(httpx.post(fleet.url + "/v1/chat/completions", content=big), 413)

    def gen():
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    check(httpx.post(fleet.url + "/v1/chat/completions", content=gen()), 413)


def test_absurd_max_tokens_for_the_model_is_relayed_from_engine(fleet):
    # within the gateway's generic bound but beyond the model's context: the engine refuses, the gateway relays
    r = httpx.post(fleet.url + "/v1/chat/completions", json=dict(GOOD, max_tokens=131_070))
    check(r, 400)


def test_openai_client_sees_typed_errors(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-99", messages=[{"role": "user", "content": "hi"}])
    assert "gpt-99" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=-1)
    assert "max_tokens" in str(e.value)


def test_unreachable_engine_is_502_in_openai_format():
    import socket

    from steersman.testing import LiveFleet

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    dead = [{"name": "dead", "url": f"http://127.0.0.1:{port}", "engine": "vllm", "models": ["m"]}]
    # many scrape failures allowed, so the replica stays routable and the request really tries it
    with LiveFleet(endpoints=dead, gateway={"unhealthy_after_failures": 1000}) as lf:
        r = httpx.post(lf.url + "/v1/chat/completions", json=dict(GOOD, model="m"))
        err = check(r, 502)
        assert "unreachable" in err["message"]
        # the failure marked it unhealthy: now there is no replica at all -> 503 with Retry-After
        r = httpx.post(lf.url + "/v1/chat/completions", json=dict(GOOD, model="m"))
        check(r, 503)
        assert r.headers["Retry-After"] == "1"


def test_a_completions_batch_past_the_sequence_limit_is_400_naming_prompt(fleet, client):
    """prompts x n beyond gateway.max_completion_sequences (2,048): one body would hand the engine an
    unbounded batch (100 prompts x n 128 = 12,800 sequences went through)."""
    body = {"model": "llama-3.1-8b", "prompt": ["hi"] * 100, "n": 21, "max_tokens": 1}
    err = check(httpx.post(fleet.url + "/v1/completions", json=body), 400, "prompt")
    assert "2100" in err["message"] and "2048" in err["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="llama-3.1-8b", prompt=["hi"] * 2049, max_tokens=1)
    assert "prompt" in str(e.value)
    ok = client.completions.create(model="llama-3.1-8b", prompt=["hi"] * 4, n=2, max_tokens=1)
    assert len(ok.choices) == 8
