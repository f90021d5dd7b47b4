"""The gateway's listening host: its simulated replicas stay on loopback whatever it is (their /admin/faults is
open), an IPv6 literal is bracketed in its URL, and a bad admin digest fails before anything is built."""

import socket

import pytest

from steersman.testing import LiveFleet


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_a_gateway_on_ipv6_loopback_keeps_its_engine_sims_on_127_0_0_1_and_brackets_its_url():
    from openai import OpenAI

    sim = {"speedup": 50.0, "replicas": [{"gpu": "H100", "model": "llama-3.1-8b"}]}
    with LiveFleet(gateway={"host": "::1"}, extra={"simulated": sim}) as lf:
        gw = lf.gateway
        assert gw.url == f"http://[::1]:{gw.port}"  # was http://::1:PORT
        # the engine-sims were given the gateway's host (`up --host 0.0.0.0` exposed them on every interface)
        assert gw.sim_fleet.host == "127.0.0.1"
        assert [r.url.split(":")[1] for r in gw.fleet.replicas] == ["//127.0.0.1"]
        with OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
            out = client.chat.completions.create(model="llama-3.1-8b", max_tokens=4,
                                                 messages=[{"role": "user", "content": "hi"}])
            assert out.choices[0].message.content


def test_the_admin_digest_is_checked_before_the_gateway_builds_anything(monkeypatch):
    import dataclasses

    import msgspec

    from steersman.api import gateway as gateway_module
    from steersman.fleet.config import parse_fleet

    cfg = parse_fleet({"endpoints": [{"url": "http://127.0.0.1:1", "models": ["m"]}]})
    settings = cfg.gateway
    bad = object.__new__(type(settings))  # as a caller building GatewaySettings past its checks would
    for f in dataclasses.fields(settings):
        object.__setattr__(bad, f.name, getattr(settings, f.name))
    object.__setattr__(bad, "admin_key_sha256", "notahash")
    built = []
    monkeypatch.setattr(gateway_module, "make_tracer", lambda *a: built.append("tracer"))
    monkeypatch.setattr(gateway_module, "GatewayMetrics", lambda *a: built.append("metrics"))
    with pytest.raises(ValueError, match="admin_key_sha256"):
        gateway_module.Gateway(msgspec.structs.replace(cfg, gateway=bad))
    assert built == []


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_an_engine_sim_on_ipv6_loopback_gives_a_url_a_client_can_use():
    import httpx

    from steersman.enginesim.app import SimServerConfig

    with LiveFleet(sims=[SimServerConfig(host="::1", speedup=50.0, port=0)], with_gateway=False) as lf:
        url = lf.sims[0].url
        assert url.startswith("http://[::1]:")  # was http://::1:PORT, which no client parses
        assert httpx.get(url + "/health", timeout=10).status_code == 200
