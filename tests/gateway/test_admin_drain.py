"""An operator drains a replica (POST /admin/replicas/{name}/drain) before an engine's upgrade: no new request goes
there, the stream under way there finishes, GET /admin/fleet shows it draining and its requests under way; resume
puts it back.  Admin-key guarded; unknown replicas and actions are 404s in the OpenAI error format."""

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import OpenAI

from steersman.control.tenants import hash_key
from steersman.testing import LiveFleet
from steersman.testing.scripted import Script

ADMIN = "sk-admin-drain-test"


@pytest.fixture(scope="module")
def lf():
    slow = Script(pieces=tuple(f"w{i} " for i in range(30)), gap_s=0.02)
    with LiveFleet(scripted=[slow, slow], policy="least-request",
                   gateway={"admin_key_sha256": hash_key(ADMIN)}) as f:
        yield f


def _admin(lf, method, path, key=ADMIN):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, lf.url + path, headers=headers, timeout=10)


def _counts(lf):
    return [len(e.seen.bodies) for e in lf.scripted]


def _six(client):
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda _: client.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "x"}]), range(6)))


def _replica(lf, name):
    return next(r for r in _admin(lf, "GET", "/admin/fleet").json()["replicas"] if r["name"] == name)


def test_a_drained_replica_finishes_its_stream_gets_nothing_new_and_resume_puts_it_back(lf):
    client = OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    before = _counts(lf)
    got: list[str] = []
    started = threading.Event()

    def stream():
        for c in client.chat.completions.create(model="scripted", stream=True,
                                                messages=[{"role": "user", "content": "hi"}]):
            if c.choices and c.choices[0].delta.content:
                got.append(c.choices[0].delta.content)
                started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(10)
    busy = next(i for i, (a, b) in enumerate(zip(before, _counts(lf))) if b > a)
    name = f"scripted-{busy}"
    r = _admin(lf, "POST", f"/admin/replicas/{name}/drain")
    assert r.status_code == 200 and r.json()["draining"] is True and r.json()["routable"] is False
    assert r.json()["in_flight"] == 1  # the stream under way
    mid = _counts(lf)
    _six(client)  # least-request would send some there: none goes
    after = _counts(lf)
    assert after[busy] == mid[busy] and after[1 - busy] == mid[1 - busy] + 6
    t.join(30)
    assert "".join(got) == "".join(f"w{i} " for i in range(30))  # the stream finished there, whole
    assert _replica(lf, name)["in_flight"] == 0  # empty: the engine may be upgraded now

    r = _admin(lf, "POST", f"/admin/replicas/{name}/resume")
    assert r.status_code == 200 and r.json()["draining"] is False and r.json()["routable"] is True
    assert httpx.get(lf.url + "/health", timeout=10).json()["replicas_draining"] == 0
    _six(client)
    assert _counts(lf)[busy] > after[busy]
    client.close()


def test_draining_every_replica_of_a_model_refuses_its_requests_clearly_not_a_hang(lf):
    for i in range(2):
        assert _admin(lf, "POST", f"/admin/replicas/scripted-{i}/drain").status_code == 200
    try:
        r = httpx.post(lf.url + "/v1/chat/completions", timeout=30,
                       json={"model": "scripted", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 503 and "in rotation" in r.json()["error"]["message"]  # (not "no healthy replica")
        h = httpx.get(lf.url + "/health", timeout=10)  # (a load balancer's check: nothing can be served here)
        assert h.status_code == 503 and h.json()["replicas_draining"] == 2 and h.json()["replicas_healthy"] == 0
    finally:
        for i in range(2):
            _admin(lf, "POST", f"/admin/replicas/scripted-{i}/resume")


@pytest.mark.parametrize("path, status, code, needle", [
    ("/admin/replicas/nope/drain", 404, "replica_not_found", "scripted-0"),
    ("/admin/replicas/scripted-0/explode", 404, "not_found", "/drain"),
    ("/admin/replicas/drain", 404, "not_found", "/resume"),
])
def test_unknown_replicas_and_actions_are_404s_naming_what_exists(lf, path, status, code, needle):
    r = _admin(lf, "POST", path)
    err = r.json()["error"]
    assert r.status_code == status and err["code"] == code and needle in err["message"]


@pytest.mark.parametrize("key, status", [(None, 401), ("sk-tenant", 403)])
def test_drain_needs_the_admin_key(lf, key, status):
    r = _admin(lf, "POST", "/admin/replicas/scripted-0/drain", key=key)
    assert r.status_code == status
    assert _replica(lf, "scripted-0")["draining"] is False
