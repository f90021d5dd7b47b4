"""``POST /admin/reload``: a running ``steersman serve`` reads its fleet file again and applies its tenants and API keys
in place (a new key works, a removed one is a 401, a tenant's changed limit applies, a stream under way goes on); a
file that does not parse, or that would open a keyed gateway, changes nothing; other changed sections are named as not
applied.  Over real HTTP with the official client; the pure plan alone below."""

import json
import threading
import time

import httpx
import openai
import pytest
import yaml

from steersman.api.reload import directory_of, reload_plan
from steersman.control.tenants import generate_key, hash_key
from steersman.fleet.config import parse_fleet
from tests.gateway.conftest import serve_process, stop_process
from tests.gateway.test_handover import _free_port

HI = [{"role": "user", "content": "hi"}]
SIM = {"speedup": 4.0, "replicas": [{"gpu": "H100", "model": "llama-3.1-8b"}]}


def _doc(keys: dict[str, str], tenants: dict | None = None, **more) -> dict:
    return {"gateway": {"port": more.pop("port"), "admin_key_sha256": hash_key("admin-key")}, "simulated": SIM,
            "tenants": tenants or {name: {} for name in keys},
            "api_keys": [{"sha256": hash_key(k), "tenant": name} for name, k in keys.items()], **more}


@pytest.fixture
def served(tmp_path):
    port = _free_port()
    cfg = tmp_path / "fleet.yaml"
    alice = generate_key()[0]
    cfg.write_text(yaml.safe_dump(_doc({"alice": alice}, port=port)))
    proc, url = serve_process(cfg, tmp_path / "gw.log")
    try:
        yield url, cfg, port, alice, tmp_path / "gw.log"
    finally:
        stop_process(proc)


def _reload(url: str, key: str = "admin-key") -> httpx.Response:
    return httpx.post(url + "/admin/reload", headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _chat(url: str, key: str, **kw):
    with openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30) as c:
        return c.chat.completions.create(model="llama-3.1-8b", messages=HI, max_tokens=4, **kw)


def test_a_reload_adds_and_revokes_keys_and_changes_limits_without_a_restart(served):
    url, cfg, port, alice, log = served
    bob = generate_key()[0]
    with pytest.raises(openai.AuthenticationError):
        _chat(url, bob)
    assert _chat(url, alice).choices[0].message.content

    # a stream of alice's under way across the reload that revokes her key: its tokens keep arriving after the reload
    # answered (timed as they arrive, in a thread: a buffered stream would read as "still going" anyway)
    arrivals: list[float] = []
    ended: list[str | None] = []

    def stream():
        with openai.OpenAI(base_url=url + "/v1", api_key=alice, max_retries=0, timeout=60) as c:
            for chunk in c.chat.completions.create(model="llama-3.1-8b", messages=HI, max_tokens=2000, stream=True,
                                                   extra_body={"ignore_eos": True}):  # ~4 s at 4x real time
                if chunk.choices and chunk.choices[0].delta.content:
                    arrivals.append(time.monotonic())
                if chunk.choices and chunk.choices[0].finish_reason:
                    ended.append(chunk.choices[0].finish_reason)
    t = threading.Thread(target=stream)
    t.start()
    deadline = time.monotonic() + 30
    while not arrivals and time.monotonic() < deadline:
        time.sleep(0.01)
    cfg.write_text(yaml.safe_dump(_doc({"bob": bob}, {"bob": {"requests_per_minute": 2}}, port=port)))
    r = _reload(url)
    reloaded = time.monotonic()
    t.join(60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["applied"] == ["tenants"] and body["tenants"]["added"] == ["bob"]
    assert body["tenants"]["removed"] == ["alice"] and body["api_keys"] == {"before": 1, "after": 1}
    assert body["not_applied"] == [] and body["open"] is False
    assert ended == ["length"] and len(arrivals) == 2000  # whole
    assert sum(a > reloaded for a in arrivals) > 500  # and much of it after the reload: not cut by it

    with pytest.raises(openai.AuthenticationError):
        _chat(url, alice)  # revoked
    assert _chat(url, bob).choices[0].message.content  # new, and held to its new limit: 2 a minute
    assert _chat(url, bob).choices[0].message.content
    with pytest.raises(openai.RateLimitError) as over:
        _chat(url, bob)
    assert over.value.code == "rate_limit_exceeded" and "bob" in over.value.message
    assert "fleet file reloaded by an operator" in log.read_text()


def test_a_bad_or_opening_file_changes_nothing_and_other_sections_are_named(served):
    url, cfg, port, alice, _ = served
    good = cfg.read_text()
    assert _reload(url, "not-admin").status_code == 403

    cfg.write_text(good.replace("tenants:", "tenants: [oops\n"))  # not YAML
    r = _reload(url)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_fleet_file"
    assert "nothing changed" in r.json()["error"]["message"]

    doc = yaml.safe_load(good)
    doc["tenants"]["alice"]["max_concurrent_requests"] = 0  # a bad value: named
    cfg.write_text(yaml.safe_dump(doc))
    r = _reload(url)
    assert r.status_code == 400 and "max_concurrent_requests" in r.json()["error"]["message"]

    doc = yaml.safe_load(good)
    del doc["api_keys"]  # keys lost by mistake: the gateway would be open
    cfg.write_text(yaml.safe_dump(doc))
    r = _reload(url)
    assert r.status_code == 409 and r.json()["error"]["code"] == "reload_refused"
    with pytest.raises(openai.AuthenticationError):
        _chat(url, "sk-anything")  # still keyed
    assert _chat(url, alice).choices[0].message.content  # and alice still served

    doc = yaml.safe_load(good)
    doc["simulated"]["replicas"].append({"gpu": "A100", "model": "llama-3.1-8b"})
    doc["scheduler"] = {"saturation_queue_depth": 7}
    cfg.write_text(yaml.safe_dump(doc))
    r = _reload(url)
    body = r.json()
    assert r.status_code == 200 and body["applied"] == [] and body["not_applied"] == ["simulated", "scheduler"]
    assert "reuse_port" in body["message"]


def test_a_gateway_started_without_a_fleet_file_has_nothing_to_reload_and_an_open_admin_surface_none_at_all():
    from steersman.testing import LiveFleet
    from steersman.testing.scripted import Script

    with LiveFleet(scripted=[Script(pieces=("ok",))], policy="least-request",
                   gateway={"admin_key_sha256": hash_key("admin-key")}) as lf:
        r = _reload(lf.url)
    assert r.status_code == 409 and r.json()["error"]["code"] == "no_fleet_file"
    with LiveFleet(scripted=[Script(pieces=("ok",))], policy="least-request") as lf:  # no admin key: /admin/* open
        lf.gateway.reload_from = lambda: None  # (as if started from a file)
        r = httpx.post(lf.url + "/admin/reload", timeout=10)
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"


def test_the_plan_compares_tenants_by_every_setting_and_keys_by_digest():
    a, b = generate_key()[0], generate_key()[0]
    base = parse_fleet(_doc({"t": a}, port=0))
    same = parse_fleet(_doc({"t": a}, port=0))
    plan = reload_plan(base, same, directory_of(base))
    assert not plan.applies and plan.body()["applied"] == [] and plan.not_applied == ()
    other_key = parse_fleet(_doc({"t": b}, port=0))  # one key for another: the same count, applied
    plan = reload_plan(base, other_key, directory_of(base))
    assert plan.applies and plan.keys_before == plan.keys_after == 1 and plan.changed == ()
    weighted = parse_fleet(_doc({"t": a}, {"t": {"weight": 2}}, port=0))
    assert reload_plan(base, weighted, directory_of(base)).changed == ("t",)
    # an open gateway may be given keys (it stops being open); its open tenant is compared as a tenant
    opened = parse_fleet({"gateway": {"port": 0}, "simulated": SIM})
    plan = reload_plan(opened, base, directory_of(opened))
    assert plan.applies and plan.added == ("t",) and plan.removed == ("default",) and not plan.tenants.open
    json.dumps(plan.body())


def test_a_reload_caps_a_tenants_concurrency_counting_only_what_it_admits_after(served):
    # tenant alice runs 2 streams uncapped; a reload caps her at 1: the 2 old streams were never counted, so when
    # they end they give back no place (the cap counts from the reload on: 1 new admitted, the next a 429)
    url, cfg, port, alice, _ = served
    done, errors = [], []

    def stream(started: threading.Event, tokens=300):
        try:
            with openai.OpenAI(base_url=url + "/v1", api_key=alice, max_retries=0, timeout=60) as c:
                n = 0
                for _ in c.chat.completions.create(model="llama-3.1-8b", messages=HI, max_tokens=tokens, stream=True,
                                                   extra_body={"ignore_eos": True}):
                    started.set()
                    n += 1
                done.append(n)
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)
            started.set()
    first = [threading.Event(), threading.Event()]
    old = [threading.Thread(target=stream, args=(e,)) for e in first]
    for t in old:
        t.start()
    assert all(e.wait(30) for e in first) and errors == []  # both admitted and streaming
    doc = yaml.safe_load(cfg.read_text())
    doc["tenants"]["alice"]["max_concurrent_requests"] = 1
    cfg.write_text(yaml.safe_dump(doc))
    assert _reload(url).json()["tenants"]["changed"] == ["alice"]
    started = threading.Event()
    new = threading.Thread(target=stream, args=(started, 1500))  # ~3 s: still streaming once the old ones end
    new.start()
    assert started.wait(30) and errors == []
    for t in old:
        t.join(60)
    assert len(done) == 2 and errors == []  # the old ones ended; the new one still streams
    with pytest.raises(openai.RateLimitError) as capped:
        _chat(url, alice)
    assert capped.value.code == "concurrency_limit_exceeded"
    new.join(60)
    assert _chat(url, alice).choices[0].message.content  # its place back


def test_a_changed_admission_section_is_not_applied_to_the_reloaded_tenants():
    a = generate_key()[0]
    base = parse_fleet(_doc({"t": a}, port=0))
    moved = parse_fleet(_doc({"t": a}, port=0, admission={"default_priority": "batch"}))
    plan = reload_plan(base, moved, directory_of(base))
    assert plan.not_applied == ("admission",) and plan.changed == () and not plan.applies
    assert plan.tenants.get("t").priority == directory_of(base).get("t").priority  # standard, as running


def test_reloads_read_one_at_a_time_even_when_a_client_gives_up():
    # a slow read (a plugin importing, a slow disk) whose client disconnects keeps the lock until it ends: the next
    # reload reads after it, never beside it (two plugin loads at once could unregister each other's names)
    from steersman.testing import LiveFleet
    from steersman.testing.scripted import Script

    reading, most = [0], [0]
    with LiveFleet(scripted=[Script(pieces=("ok",))], policy="least-request",
                   gateway={"admin_key_sha256": hash_key("admin-key")}) as lf:
        cfg = lf.gateway.cfg

        def slow():
            reading[0] += 1
            most[0] = max(most[0], reading[0])
            time.sleep(1.0)
            reading[0] -= 1
            return cfg
        lf.gateway.reload_from = slow
        with pytest.raises(httpx.TimeoutException):
            httpx.post(lf.url + "/admin/reload", headers={"Authorization": "Bearer admin-key"}, timeout=0.2)
        r = _reload(lf.url)  # sent while the first read still runs
    assert r.status_code == 200 and r.json()["applied"] == [] and most[0] == 1
