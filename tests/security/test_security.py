"""Security: admin endpoints need the admin key, keys exist only as hashes, tenants are isolated,
prompts are not logged unless configured, and no request can point the gateway at another host."""

from __future__ import annotations

import logging
import socket
import threading
import time

import httpx
import pytest

from steersman.control.tenants import hash_key
from steersman.enginesim.app import SimServerConfig
from steersman.fleet.config import parse_fleet
from steersman.testing import LiveFleet

ADMIN = "sk-admin-7f3e2b9c4d5a6e1f"
KEY_A = "sk-steersman-tenant-a-0123456789abcdef"
KEY_B = "sk-steersman-tenant-b-fedcba9876543210"
SECRET = "zebra-cobalt-7731-SECRET-PROMPT"
MODEL = "llama-3.1-8b"
CHAT = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _extra(**more):
    return {
        "tenants": {"acme": {"priority": "critical"}, "rival": {"priority": "standard", "requests_per_minute": 2}},
        "api_keys": [{"sha256": hash_key(KEY_A), "tenant": "acme"}, {"sha256": hash_key(KEY_B), "tenant": "rival"}],
        **more,
    }


def _sims(n=1, **kw):
    return [SimServerConfig(gpu="H100", model=MODEL, speedup=50.0, port=0, **kw) for _ in range(n)]


@pytest.fixture(scope="module")
def fleet():
    with LiveFleet(sims=_sims(admin_key_sha256=hash_key(ADMIN)), extra=_extra(),
                   gateway={"admin_key_sha256": hash_key(ADMIN)}) as lf:
        yield lf


# ---- admin endpoints ------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/metrics", "/admin/fleet"])
def test_admin_endpoints_need_the_admin_key(fleet, path):
    url = fleet.url + path
    r = httpx.get(url)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_admin_key"
    r = httpx.get(url, headers=_auth(KEY_A))  # a tenant's key is not an admin key
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert httpx.get(url, headers=_auth("sk-wrong")).status_code == 403
    assert httpx.get(url, headers={"Authorization": hash_key(ADMIN)}).status_code == 401  # the hash is not the key
    assert httpx.get(url, headers=_auth(hash_key(ADMIN))).status_code == 403
    r = httpx.get(url, headers=_auth(ADMIN))
    assert r.status_code == 200
    if path == "/admin/fleet":
        assert r.json()["replicas"][0]["url"].startswith("http://127.0.0.1:")


def test_public_endpoints_reveal_no_internals(fleet):
    for path in ("/health", "/v1/models", "/openapi.json"):
        r = httpx.get(fleet.url + path, headers=_auth(KEY_A) if path == "/v1/models" else None)
        assert r.status_code == 200
        text = r.text
        assert "127.0.0.1" not in text and "sim-0" not in text and "acme" not in text and "rival" not in text


def test_the_model_list_needs_a_tenants_key_when_keys_are_configured(fleet):
    """As OpenAI's /v1/models and vLLM's with --api-key: no key or a wrong one is a 401 (the list was open)."""
    import openai

    for path in ("/v1/models", "/v1/models/llama-3.1-8b", "/v1/models/no-such-model"):
        for headers in (None, _auth("sk-wrong")):
            r = httpx.get(fleet.url + path, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
    r = httpx.get(fleet.url + "/v1/models/llama-3.1-8b", headers=_auth(KEY_B))
    assert r.status_code == 200 and r.json()["id"] == "llama-3.1-8b"
    assert "llama-3.1-8b" in [m.id for m in openai.OpenAI(base_url=fleet.url + "/v1", api_key=KEY_A).models.list()]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=fleet.url + "/v1", api_key="sk-wrong", max_retries=0).models.list()


def test_the_api_description_lists_the_models_only_to_a_tenants_key(fleet):
    """/openapi.json stays open (tools read it), but its `model` enum named the fleet's models to anyone."""
    def model_field(headers):
        r = httpx.get(fleet.url + "/openapi.json", headers=headers)
        assert r.status_code == 200
        return r.json()["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]

    for headers in (None, _auth("sk-wrong")):
        assert "enum" not in model_field(headers) and "llama-3.1-8b" not in httpx.get(fleet.url + "/openapi.json").text
    assert model_field(_auth(KEY_A))["enum"] == [MODEL]


def test_engine_sim_admin_faults_need_its_admin_key(fleet):
    url = fleet.sims[0].url + "/admin/faults"
    assert httpx.get(url).status_code == 401
    assert httpx.post(url, json={"slowdown": 2.0}, headers=_auth(KEY_A)).status_code == 403
    assert httpx.delete(url, headers=_auth("nope")).status_code == 403
    assert httpx.get(url, headers=_auth(ADMIN)).status_code == 200


def test_admin_key_must_be_configured_as_a_hash():
    from steersman.api.admin import AdminGuard

    with pytest.raises(ValueError, match="SHA-256"):
        AdminGuard(ADMIN)


# ---- keys only as hashes ---------------------------------------------------------------------------
def _strings(obj, seen=None, depth=0):
    """Every string reachable from ``obj`` (dataclasses, slots, dicts, sequences), bounded."""
    seen = seen if seen is not None else set()
    if id(obj) in seen or depth > 12:
        return
    seen.add(id(obj))
    if isinstance(obj, str):
        yield obj
        return
    if isinstance(obj, (bytes, bytearray)):
        yield bytes(obj).decode("latin-1")
        return
    if isinstance(obj, (int, float, bool, type(None))) or callable(obj) and not hasattr(obj, "__dict__"):
        return
    if isinstance(obj, dict) or hasattr(obj, "items") and callable(obj.items):
        try:
            for k, v in obj.items():
                yield from _strings(k, seen, depth + 1)
                yield from _strings(v, seen, depth + 1)
        except TypeError:
            pass
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            yield from _strings(v, seen, depth + 1)
        return
    for name in getattr(type(obj), "__slots__", ()):
        yield from _strings(getattr(obj, name, None), seen, depth + 1)
    for v in getattr(obj, "__dict__", {}).values():
        yield from _strings(v, seen, depth + 1)


def test_api_keys_exist_only_as_hashes(fleet):
    r = httpx.post(fleet.url + "/v1/chat/completions", json=CHAT, headers=_auth(KEY_A))
    assert r.status_code == 200
    gw = fleet.gateway
    held = list(_strings(gw.tenants)) + list(_strings(gw.cfg)) + list(_strings(gw.admin)) + list(_strings(gw.settings))
    assert hash_key(KEY_A) in held  # the walk does reach the key table
    for key in (KEY_A, KEY_B, ADMIN):
        assert not any(key in s for s in held), "a plaintext key is held by the gateway"


def test_a_plaintext_key_in_the_config_is_refused():
    with pytest.raises(ValueError, match="unknown field"):
        parse_fleet({"endpoints": [], "tenants": {"acme": {}}, "api_keys": [{"key": KEY_A, "tenant": "acme"}]}, "t")
    with pytest.raises(ValueError, match="not the key"):
        parse_fleet({"endpoints": [], "tenants": {"acme": {}}, "api_keys": [{"sha256": KEY_A, "tenant": "acme"}]}, "t")


def test_refusals_do_not_echo_keys_or_name_other_tenants(fleet):
    r = httpx.post(fleet.url + "/v1/chat/completions", json=CHAT, headers=_auth("sk-guessing-" + KEY_A[-8:]))
    assert r.status_code == 401 and KEY_A[-8:] not in r.text
    codes = [httpx.post(fleet.url + "/v1/chat/completions", json=CHAT, headers=_auth(KEY_B)).status_code for _ in range(4)]
    assert 429 in codes  # rival: 2 requests per minute
    r = httpx.post(fleet.url + "/v1/chat/completions", json=CHAT, headers=_auth(KEY_B))
    assert r.status_code == 429 and "acme" not in r.text and KEY_B not in r.text and hash_key(KEY_B) not in r.text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"])
def test_a_request_without_a_valid_key_is_refused_before_its_body_is_read(fleet, path):
    # the chat, completion and embedding paths parsed the body first: malformed JSON was a 400, another media type a
    # 415, for anyone (and the body decoded and validated for a client with no key)
    for body, headers in ((b"{nope", {}), (b"{}", {"Content-Type": "text/plain"}), (b"{nope", _auth("sk-wrong"))):
        r = httpx.post(fleet.url + path, content=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)


# ---- tenant isolation ------------------------------------------------------------------------------
def test_one_tenant_cannot_touch_another_tenants_workflow_state(fleet):
    wf = {"x-steersman-workflow-id": "shared-name", "x-steersman-workflow-step": "2", "x-steersman-workflow-steps": "4"}
    for _ in range(2):
        assert httpx.post(fleet.url + "/v1/chat/completions", json=CHAT, headers={**_auth(KEY_A), **wf}).status_code == 200
    states = fleet.gateway.workflows._states  # keyed by (tenant, workflow id)
    acme = states[("acme", "shared-name")]
    deadline = time.monotonic() + 5
    while acme.calls < 2 and time.monotonic() < deadline:  # a request is settled just after its response
        time.sleep(0.01)
    snapshot = {k: getattr(acme, k) for k in ("calls", "tokens", "spent_usd")}
    assert snapshot["calls"] == 2 and snapshot["tokens"] > 0
    r = httpx.post(fleet.url + "/v1/chat/completions", json=CHAT, headers={**_auth(KEY_B), **wf})  # same id, other tenant
    assert r.status_code in (200, 429)
    assert {k: getattr(acme, k) for k in ("calls", "tokens", "spent_usd")} == snapshot  # acme's workflow untouched
    rival = states.get(("rival", "shared-name"))
    assert rival is None or (rival is not acme and rival.calls <= 1)


# ---- prompts are not logged ------------------------------------------------------------------------
def _exercise(url: str) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": SECRET}]}
    httpx.post(url + "/v1/chat/completions", json=body, headers=_auth(KEY_A))
    httpx.post(url + "/v1/chat/completions", json={**body, "stream": True}, headers=_auth(KEY_A))
    httpx.post(url + "/v1/chat/completions", json={**body, "max_tokens": 131_070}, headers=_auth(KEY_A))  # engine refuses
    httpx.post(url + "/v1/chat/completions", json={**body, "max_tokens": "x"}, headers=_auth(KEY_A))  # gateway refuses
    httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": SECRET, "max_tokens": 3}, headers=_auth(KEY_A))
    httpx.post(url + "/v1/chat/completions", content=b'{"model": "' + SECRET.encode() + b'", "messages": [', headers=_auth(KEY_A))


@pytest.mark.parametrize("log_prompts", [False, True])
def test_prompts_are_not_logged_unless_configured(caplog, log_prompts):
    caplog.set_level(logging.DEBUG)
    with LiveFleet(sims=_sims(), extra=_extra(), gateway={"log_prompts": log_prompts}) as lf:
        _exercise(lf.url)
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert caplog.records  # DEBUG capture works (startup messages at least)
    assert (SECRET in logged) is log_prompts


# ---- upstream URLs come from configuration only -------------------------------------------------------
class _Decoy:
    """A listener that counts connections: the gateway must never connect to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            c.close()

    def close(self) -> None:
        self._stop = True
        self._t.join(2)
        self.sock.close()


def test_no_request_field_or_header_redirects_the_gateway(fleet):
    decoy = _Decoy()
    evil = f"http://127.0.0.1:{decoy.port}"
    try:
        headers = {**_auth(KEY_A), "Host": f"127.0.0.1:{decoy.port}", "X-Forwarded-Host": f"127.0.0.1:{decoy.port}",
                   "Forwarded": f"host=127.0.0.1:{decoy.port}", "X-Forwarded-For": "127.0.0.1",
                   "x-steersman-upstream": evil, "x-upstream-url": evil, "x-real-ip": "127.0.0.1"}
        bodies = [{**CHAT, k: evil} for k in ("url", "base_url", "api_base", "endpoint", "upstream", "server_url")]
        bodies += [{**CHAT, "model": evil + "/v1"}, {**CHAT, "model": f"127.0.0.1:{decoy.port}"}]
        for b in bodies:
            r = httpx.post(fleet.url + "/v1/chat/completions", json=b, headers=headers)
            assert r.status_code in (200, 400, 404), r.text
        # an absolute-form request target (proxy style) names the decoy too
        with socket.create_connection(("127.0.0.1", fleet.gateway.port)) as s:
            payload = httpx.Request("POST", "http://x", json=CHAT).read()
            s.sendall(b"POST %s/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                      % (evil.encode(), KEY_A.encode(), len(payload), payload))
            s.settimeout(10)
            resp = b""
            while chunk := s.recv(65536):
                resp += chunk
            assert resp.split(b" ", 2)[1] in (b"200", b"400", b"404")
        assert decoy.connections == 0
    finally:
        decoy.close()


# ---- engine prefix caches: a tenant's cached prompt is no timing oracle for another ------------------------
@pytest.mark.parametrize("isolate", [True, False])
def test_tenant_prefix_caches_are_isolated_when_configured(isolate):
    long_prompt = " ".join(f"confidential clause {i} of the merger agreement" for i in range(60))
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": long_prompt}]}

    def cached(key: str, salt: str | None = None) -> int:
        b = dict(body, cache_salt=salt) if salt else body
        r = httpx.post(lf.url + "/v1/chat/completions", json=b, headers=_auth(key), timeout=10)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    with LiveFleet(sims=_sims(), extra=_extra(), gateway={"isolate_tenant_caches": isolate}) as lf:
        assert cached(KEY_A) == 0
        assert cached(KEY_A) > 0  # a tenant keeps its own cache hits
        if isolate:
            acme_salt = "steersman-" + __import__("hashlib").sha256(b"acme").hexdigest()[:24]
            assert cached(KEY_B, salt=acme_salt) == 0  # naming acme's salt does not reach acme's blocks
            # the client's salt is kept beside the tenant's (rival|acme-salt): rival's own blocks from the request above
            assert cached(KEY_B, salt=acme_salt) > 0
        else:
            assert cached(KEY_B) > 0  # engines share prefix blocks across tenants (vLLM's default)
