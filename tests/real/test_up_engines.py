"""`steersman up --engines llamacpp:N`: real engines in one command, and none left behind however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from openai import OpenAI

from steersman.fleet.processes import free_port

from realhelpers import MODEL, require_binary

pytestmark = pytest.mark.timeout(300)


def _start(n: int) -> tuple[subprocess.Popen, str, list[psutil.Process]]:
    require_binary()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "steersman", "up", "--engines", f"llamacpp:{n}", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"},
    )
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("steersman ready"):
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(180):
        proc.kill()
        pytest.fail("steersman up --engines did not become ready:\n" + "".join(lines[-40:]))
    children = [c for c in psutil.Process(proc.pid).children() if "llama-server" in c.name()]
    assert len(children) == n, f"expected {n} llama-server children, got {children}"
    return proc, f"http://127.0.0.1:{port}", children


def _gone(children: list[psutil.Process], within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_up_answers_with_a_real_model_and_stops_its_engines(sig):
    proc, url, children = _start(2)
    try:
        with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
            assert [m.id for m in c.models.list().data] == [MODEL]
            r = c.chat.completions.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hi!"}])
            assert r.choices[0].message.content and r.usage.completion_tokens > 0
        proc.send_signal(sig)
        assert proc.wait(30) == 0
        assert _gone(children), f"llama-server left running after {sig.name}: {children}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for ch in children:
            if ch.is_running():
                ch.kill()


def test_engines_die_with_a_killed_steersman():
    proc, _, children = _start(1)
    try:
        proc.kill()  # SIGKILL: no handler runs; PR_SET_PDEATHSIG must stop the engine
        proc.wait(10)
        assert _gone(children), "llama-server orphaned by a SIGKILLed steersman"
    finally:
        for ch in children:
            if ch.is_running():
                ch.kill()


def test_bad_engines_spec_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "steersman", "up", "--engines", "llamacpp:zero"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "llamacpp:N" in r.stderr
