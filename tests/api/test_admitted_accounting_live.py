"""What the gateway counts against a tenant and a workflow is what was admitted as the client's call, over real HTTP
with the official client: a request its limits refuse makes no workflow entry (the LRU is shared by every tenant),
and a Responses call with ``truncation: "auto"`` is one call however many shorter tries it took."""

from __future__ import annotations

import openai
import pytest

from steersman.config.engine import EngineSettings
from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet, tenants_with_keys

MODEL = "llama-3.1-8b"
HI = [{"role": "user", "content": "hi"}]


def _client(lf: LiveFleet, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=lf.url + "/v1", api_key=key, max_retries=0, timeout=30)


def test_a_throttled_tenants_refused_requests_do_not_evict_other_tenants_workflows():
    tenants = {"good": {}, "spam": {"requests_per_minute": 1}}
    keys, extra = tenants_with_keys(tenants)
    extra["admission"] = {"workflow_max_entries": 4}
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], extra=extra) as lf, \
            _client(lf, keys["good"]) as good, _client(lf, keys["spam"]) as spam:
        wf = lf.gateway.workflows
        good.chat.completions.create(model=MODEL, max_tokens=4, messages=HI, extra_headers={
            "x-steersman-workflow-id": "task", "x-steersman-workflow-step": "1", "x-steersman-workflow-steps": "4"})
        refused = 0
        for i in range(10):
            try:
                spam.chat.completions.create(model=MODEL, max_tokens=4, messages=HI,
                                             extra_headers={"x-steersman-workflow-id": f"junk-{i}"})
            except openai.RateLimitError:
                refused += 1
        assert refused == 9  # its bucket held one request
        spam_entries = [k for k in wf._states if k[0] == "spam"]
        assert spam_entries == [("spam", "junk-0")]  # the admitted one only (each made one before, and 4 fit)
        assert ("good", "task") in wf._states
        s = wf._states[("good", "task")]
        assert s.calls == 1 and s.steps == 4 and s.spent_usd > 0.0  # its sunk cost: what protects its next steps


def test_a_truncated_responses_call_is_one_call_to_its_workflow_and_its_rate_limit():
    """The fourth turn no longer fits the engine's 512-token context: the gateway tries it whole (refused for its
    length), then without its oldest turns.  Each try went through the whole request path: the refused ones took a
    request from the tenant's bucket (the client got a 429 mid-sequence) and were recorded as failed calls of its
    workflow (calls 2-3 and missed for one client call)."""
    tenants = {"t": {"requests_per_minute": 4}}  # a bucket of 4 requests, refilled one per 15 s
    keys, extra = tenants_with_keys(tenants)
    sim = SimServerConfig(speedup=50.0, port=0, engine=EngineSettings(max_model_len=512))
    words = lambda tag: " ".join(f"{tag}{i}" for i in range(110))  # noqa: E731  (~120 tokens a turn)
    wfh = {"x-steersman-workflow-id": "task", "x-steersman-workflow-step": "1", "x-steersman-workflow-steps": "3"}
    with LiveFleet(sims=[sim], extra=extra) as lf, _client(lf, keys["t"]) as c:
        gw = lf.gateway
        tries = []
        ended, withdrawn = gw.accounting.ended, gw.accounting.withdrawn
        gw.accounting.ended = lambda s, *a, **k: tries.append("ended") or ended(s, *a, **k)
        gw.accounting.withdrawn = lambda s: tries.append("withdrawn") or withdrawn(s)
        turn = c.responses.create(model=MODEL, input=words("a"), max_output_tokens=8)
        for tag in "bc":
            turn = c.responses.create(model=MODEL, input=words(tag), previous_response_id=turn.id,
                                      max_output_tokens=8, truncation="auto")
        limiter = gw.plane.admitter.limiter
        reserve, release = limiter.reserve, limiter.release
        limiter.reserve = lambda *a: tries.append("reserve") or reserve(*a)
        limiter.release = lambda *a: tries.append("release") or release(*a)
        tries.clear()
        fit = c.responses.create(model=MODEL, input=words("d"), previous_response_id=turn.id, max_output_tokens=8,
                                 truncation="auto", extra_headers=wfh)
        assert fit.status == "incomplete" and fit.usage.input_tokens <= 504
        assert tries[-1] == "ended" and tries.count("ended") == 1 and tries.count("withdrawn") >= 1
        assert tries.count("reserve") - tries.count("release") == 1  # one request of its bucket, for one call
        s = gw.workflows._states[("t", "task")]
        assert (s.calls, s.missed) == (1, False)
        assert s.tokens == pytest.approx(fit.usage.total_tokens, abs=16)  # the final try's (the gateway's count)
