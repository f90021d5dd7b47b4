"""A stream whose engine fails before its first event is answered with the failure's own status, not a 200."""

import httpx
import openai
import pytest

from steersman.testing import LiveFleet, Script

BODY = {"model": "scripted", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def test_an_engine_failing_before_the_first_event_gets_a_502_the_client_can_retry():
    # the only replica resets the connection after its response head: nothing reached the client, so the
    # held stream head is taken back and the client gets a 502 (the official client retries those), not a 200
    # stream holding an error event (which no client retries)
    with LiveFleet(scripted=[Script(crash_after=0)], policy="least-request") as lf:
        r = httpx.post(lf.url + "/v1/chat/completions", json=BODY, timeout=30)
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert "scripted-0" in err["message"] and err["type"] == "server_error"
        with openai.OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
            with pytest.raises(openai.APIStatusError) as got:
                for _ in client.chat.completions.create(**BODY):
                    pass
            # a status either way (502 again, or 503 once the gateway's adaptive throttle sheds for a failing fleet)
            assert got.value.status_code in (502, 503)
        m = httpx.get(lf.url + "/metrics", timeout=10).text
        assert 'steersman:requests_total{model="scripted",status="502"}' in m  # counted as what was answered
        assert 'status="200"' not in m


def test_an_engine_failing_after_the_first_event_ends_the_stream_with_an_error_event():
    with LiveFleet(scripted=[Script(crash_after=2)], policy="least-request") as lf:
        with httpx.stream("POST", lf.url + "/v1/chat/completions", json=BODY, timeout=30) as r:
            assert r.status_code == 200
            text = r.read().decode()
        assert '"error"' in text and "scripted-0" in text  # bytes went out: only an event can say it
