"""A replica that serves its model under another name (vLLM --served-model-name; a simulated replica's
``served_model_name``; an endpoint's ``model_profile``) is predicted with its model's profile.  The served name was
looked up as the model: the replica ran unmodelled on the priors (1 ms a prompt token, 50 ms a step, no KV size),
and with sheddable open traffic every request on an idle fleet was a 503 "no replica is predicted to meet its SLO"
(config audit, thirty-fifth session)."""

import pytest
from openai import OpenAI

from steersman.fleet.config import FleetConfigError, parse_fleet
from steersman.testing import LiveFleet

CHAT = {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def test_a_simulated_replica_under_a_served_name_is_modelled_and_serves_sheddable_traffic():
    sim = {"speedup": 50.0, "replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "served_model_name": "llama"}]}
    with LiveFleet(extra={"simulated": sim, "admission": {"default_priority": "sheddable"}}) as lf:
        gw = lf.gateway
        assert bool(gw.fleet.statics.modelled[0]) and gw.fleet.statics.kv_blocks[0] > 0
        with OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
            for _ in range(3):  # were 503 shed_infeasible
                assert client.chat.completions.create(model="llama", **CHAT).choices[0].message.content


def test_an_endpoints_model_profile_names_the_model_its_served_name_is():
    ep = {"url": "http://127.0.0.1:1", "gpu": "H100", "models": ["prod-chat"]}
    assert parse_fleet({"endpoints": [{**ep, "model_profile": "meta-llama/Llama-3.1-8B-Instruct"}]})
    with pytest.raises(FleetConfigError, match=r"endpoints\[0\]\.model_profile: unknown model 'gpt-9'"):
        parse_fleet({"endpoints": [{**ep, "model_profile": "gpt-9"}]})
