"""gateway.max_client_connections through the real gateway: with every connection busy, the official openai client's
request is answered 503 ``overloaded`` (which it retries after Retry-After when allowed to), counted in
steersman:requests_total; once a connection closes, requests are served again."""

import socket
import time

import httpx
import openai
import pytest

from steersman.testing import LiveFleet
from tests.gateway.conftest import sims


def _until(cond, timeout: float = 10.0) -> None:
    """Wait for the gateway to reach a state on its own (connections received, closed): not for time to pass."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_every_client_connection_busy_the_openai_client_gets_503_overloaded_then_is_served_once_one_closes():
    with LiveFleet(sims=sims(1), policy="least-request", gateway={"max_client_connections": 3}) as lf:
        http = lf.gateway.http
        assert http.max_connections == 3

        async def busy() -> int:
            return http.busy_connections

        async def open_connections() -> int:
            return len(http.connections)

        # three slow uploads: each request's head arrived, its body not yet (busy: never closed to make room)
        held = []
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", lf.gateway.port), timeout=10)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{")
            held.append(s)
        _until(lambda: lf.call(busy) == 3)

        model = lf.sims[0].model_name
        messages = [{"role": "user", "content": "hi"}]
        with openai.OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
            with pytest.raises(openai.APIStatusError) as got:
                client.chat.completions.create(model=model, messages=messages, max_tokens=2)
            err = got.value
            assert err.status_code == 503 and err.code == "overloaded" and err.type == "server_error"
            assert err.response.headers["retry-after"] == "1" and err.response.headers["x-request-id"]
            assert lf.call(open_connections) == 3  # the refused one never counted

            held.pop().close()  # one slow client leaves: room again
            _until(lambda: lf.call(open_connections) == 2)
            done = client.chat.completions.create(model=model, messages=messages, max_tokens=2)
            assert done.choices[0].message.content
        metrics = httpx.get(lf.url + "/metrics", timeout=10).text  # (the openai client's idle connection made room)
        assert 'steersman:requests_total{model="_unknown",status="503"} 1' in metrics
        for s in held:
            s.close()
        _until(lambda: lf.call(busy) == 0)
