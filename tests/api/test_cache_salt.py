"""``cache_salt``: the root of a prompt's block hashes (gateway and engine-sim alike), the tenant's salt the gateway
adds with ``isolate_tenant_caches`` combined with the client's own, and an empty salt refused as vLLM refuses it."""

from __future__ import annotations

import zlib

import httpx
import openai
import orjson
import pytest

from steersman.api.prompt import SALT_SEPARATOR, cache_root, prompt_shape, with_cache_salt
from steersman.api.schema import decode_chat
from steersman.control.tenants import hash_key
from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet
from steersman.text import block_hashes
from steersman.text.chat_tokens import tokenize_chat_array
from steersman.text.tokenizer import ROOT_HASH

MODEL = "llama-3.1-8b"
# two salts with the same CRC-32 (found by counting): the root keyed them alike, one user hit the other's blocks
CRC_TWINS = ("user-91499", "user-27860002")
SECRET = "Private notes: " + "my password hint is blue. " * 60
KEY_A, KEY_B = "sk-steersman-salt-a-0123456789abcdef", "sk-steersman-salt-b-fedcba9876543210"
TENANTS = {"tenants": {"acme": {}, "rival": {}},
           "api_keys": [{"sha256": hash_key(KEY_A), "tenant": "acme"}, {"sha256": hash_key(KEY_B), "tenant": "rival"}]}


def _cached(client: openai.OpenAI, salt: str | None) -> int:
    extra = {"cache_salt": salt} if salt is not None else {}
    r = client.chat.completions.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": SECRET}],
                                       extra_body=extra)
    return r.usage.prompt_tokens_details.cached_tokens


def test_salts_with_the_same_crc32_have_their_own_roots():
    a, b = CRC_TWINS
    assert zlib.crc32(a.encode()) == zlib.crc32(b.encode())
    assert cache_root(a) != cache_root(b) and ROOT_HASH not in (cache_root(a), cache_root(b))
    assert cache_root(None) == cache_root("") == ROOT_HASH and cache_root(a) == cache_root(a)


def test_engine_sim_keeps_salts_with_the_same_crc32_apart():
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], with_gateway=False) as lf:
        with openai.OpenAI(base_url=lf.sims[0].url + "/v1", api_key="x", max_retries=0, timeout=30) as client:
            assert _cached(client, CRC_TWINS[0]) == 0
            assert _cached(client, CRC_TWINS[1]) == 0  # was 368 of 384: the other user's blocks
            assert _cached(client, CRC_TWINS[0]) > 0  # the same salt still hits


@pytest.mark.parametrize(("body", "want"), [
    (b'{"model":"m"}', "T"),
    (b'{"model":"m","cache_salt":null}', "T"),
    (b'{"cache_salt":"alice","model":"m"}', "T|alice"),
    (b'{"model":"m","cache\\u005fsalt":"al\\u00e9"} ', "T|al\u00e9"),  # a key spelt with escapes is still the key
    (b'{"model":"m","note":"cache_salt"}', "T"),
    (b'{"model":"m","cache_salt":"a\\"b"}', 'T|a"b'),
])
def test_the_tenant_salt_is_combined_with_the_clients(body, want):
    got = orjson.loads(with_cache_salt(body, "T"))  # orjson: the last of duplicate keys wins, as in msgspec, vLLM
    assert got["cache_salt"] == want.replace("|", SALT_SEPARATOR) and got["model"] == "m"


@pytest.mark.parametrize("body", [b'{"model":"m","cache_salt":""}', b'{"model":"m","cache_salt":5}', b"[1]",
                                  b'{"model":', b'{"a":"\\u0"}'])
def test_a_body_with_a_bad_salt_or_no_object_is_left_for_its_checks_to_refuse(body):
    assert with_cache_salt(body, "T") == body


def test_the_gateway_hashes_the_combined_salt_as_the_engine_does():
    body = orjson.dumps({"model": MODEL, "cache_salt": "alice", "messages": [{"role": "user", "content": SECRET}]})
    req = decode_chat(with_cache_salt(body, "steersman-t"), 1 << 20)
    _, hashes = prompt_shape(req, 16)
    want = block_hashes(tokenize_chat_array(req.messages), 16, cache_root("steersman-t" + SALT_SEPARATOR + "alice"))
    assert req.cache_salt == "steersman-t" + SALT_SEPARATOR + "alice" and list(hashes) == want


def test_isolated_tenants_keep_their_clients_salts():
    """With ``isolate_tenant_caches`` the tenant's salt replaced the client's: users a client salted apart shared
    a cache again (0 then 720 of 728 cached).  Now a client's users stay apart, and tenants still do."""
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], extra=TENANTS,
                   gateway={"isolate_tenant_caches": True}) as lf:
        a, b = (openai.OpenAI(base_url=lf.url + "/v1", api_key=k, max_retries=0, timeout=30) for k in (KEY_A, KEY_B))
        with a, b:
            assert _cached(a, "alice") == 0
            assert _cached(a, "bob") == 0  # was 720: alice's blocks
            assert _cached(a, "alice") > 0  # alice keeps her own hits
            assert _cached(b, "alice") == 0  # another tenant's "alice" is not acme's
            assert _cached(a, None) == 0  # nor is the tenant's unsalted traffic


def test_an_empty_cache_salt_is_refused_by_engine_sim():
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], with_gateway=False) as lf:
        r = httpx.post(lf.sims[0].url + "/v1/chat/completions", timeout=30, json={
            "model": MODEL, "max_tokens": 2, "cache_salt": "", "messages": [{"role": "user", "content": "hi"}]})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "cache_salt" and "non-empty string" in err["message"]
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
        r = httpx.post(lf.sims[0].url + "/v1/completions", timeout=30, json={
            "model": MODEL, "max_tokens": 2, "cache_salt": "", "prompt": "hi"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_an_empty_cache_salt_is_refused_by_the_gateway_on_every_endpoint():
    """The gateway refuses ``cache_salt: ""`` itself (llama.cpp would not check it), with vLLM's message, on chat,
    completions and embeddings; engine-sim's embeddings too."""
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)]) as lf:
        client = openai.OpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0)
        calls = [
            lambda: client.chat.completions.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}],
                                                   extra_body={"cache_salt": ""}),
            lambda: client.completions.create(model=MODEL, max_tokens=2, prompt="hi", extra_body={"cache_salt": ""}),
            lambda: client.embeddings.create(model=MODEL, input="hi", extra_body={"cache_salt": ""}),
        ]
        for call in calls:
            with pytest.raises(openai.BadRequestError) as e:
                call()
            err = e.value.body
            assert err["param"] == "cache_salt" and "non-empty string" in err["message"]
        r = httpx.post(lf.sims[0].url + "/v1/embeddings", timeout=30, json={"model": MODEL, "input": "hi",
                                                                              "cache_salt": ""})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
