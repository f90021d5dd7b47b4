"""Every family the gateway exposes is named ``steersman:*``, as engines name theirs (``vllm:*``, ``sglang:*``,
``llamacpp:*``): one prefix to select in a dashboard or a recording rule (some were ``steersman_*``)."""

import httpx

from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet


def test_the_gateways_metric_families_share_one_prefix():
    with LiveFleet(sims=[SimServerConfig(port=0, speedup=50.0)]) as lf:
        r = httpx.post(lf.url + "/v1/chat/completions", json={
            "model": "llama-3.1-8b", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
        page = httpx.get(lf.url + "/metrics").text
    families = {line.split()[2] for line in page.splitlines() if line.startswith("# TYPE ")}
    ours = {f for f in families if not f.startswith(("python_", "process_"))}  # prometheus_client's own
    assert len(ours) >= 15, sorted(families)
    assert all(f.startswith("steersman:") for f in ours), sorted(f for f in ours if not f.startswith("steersman:"))
