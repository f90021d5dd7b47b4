"""Changing the fleet without dropping requests (``gateway.reuse_port``): a second ``steersman serve`` with a changed
fleet file listens on the same port, the old one is sent SIGTERM and drains.  The stream in flight on the old gateway
ends whole, clients sending meanwhile (the official client, its default retries) are all answered, and once the old
one is gone every request meets the new fleet."""

import signal
import socket
import subprocess
import sys
import threading
import time

from openai import OpenAI

from tests.gateway.conftest import serve_process, stop_process
from tests.gateway.test_graceful_shutdown import _Stream

STEERSMAN = [sys.executable, "-m", "steersman"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path, name: str, port: int, models: list[str], reuse_port: bool = True) -> subprocess.Popen:
    cfg = tmp_path / f"{name}.yaml"
    replicas = "".join(f"    - {{gpu: H100, model: {m}}}\n" for m in models)
    cfg.write_text(f"gateway: {{port: {port}, reuse_port: {str(reuse_port).lower()}, drain_timeout_s: 60}}\n"
                   f"simulated:\n  speedup: 1.0\n  replicas:\n{replicas}")
    return serve_process(cfg, tmp_path / f"{name}.log")[0]


def test_a_new_gateway_takes_over_the_port_while_the_old_one_drains(tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    old = _serve(tmp_path, "old", port, ["llama-3.1-8b"])
    new = None
    try:
        s = _Stream(url, 3000)  # ~25 s at real speed: still streaming through the old gateway at the handover
        s.start()
        assert s.first.wait(30) and s.error is None
        new = _serve(tmp_path, "new", port, ["llama-3.1-8b", "qwen2.5-7b"])  # the changed fleet: one more model

        answers: list[str] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def client() -> None:  # one client sending all along, on kept-alive connections
            with OpenAI(base_url=url + "/v1", api_key="unused", timeout=30) as c:  # (its default 2 retries)
                while not stop.is_set():
                    try:
                        r = c.chat.completions.create(model="llama-3.1-8b", max_tokens=2,
                                                      messages=[{"role": "user", "content": "hi"}])
                        answers.append(r.choices[0].message.content)
                    except Exception as e:  # noqa: BLE001 -- what the test counts
                        errors.append(e)

        clients = [threading.Thread(target=client, daemon=True) for _ in range(3)]
        for t in clients:
            t.start()
        time.sleep(1.0)
        assert s.is_alive() and s.finish is None and s.error is None  # still streaming through the old gateway
        old.send_signal(signal.SIGTERM)
        s.join(60)
        assert old.wait(30) == 0
        time.sleep(0.5)
        stop.set()
        for t in clients:
            t.join(30)
        assert s.error is None, s.error
        assert s.finish == "length" and s.usage.completion_tokens == 3000  # the old gateway's stream: whole
        assert errors == [] and len(answers) > 20 and all(answers)
        with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as c:  # the new fleet answers now
            assert {m.id for m in c.models.list().data} == {"llama-3.1-8b", "qwen2.5-7b"}
            assert c.chat.completions.create(model="qwen2.5-7b", max_tokens=2,
                                             messages=[{"role": "user", "content": "hi"}]).choices[0].message.content
        assert "still open are cut" not in (tmp_path / "old.log").read_text()
    finally:
        stop_process(old)
        stop_process(new)


def test_without_reuse_port_a_second_gateway_on_a_port_in_use_fails_to_start(tmp_path):
    port = _free_port()
    first = _serve(tmp_path, "first", port, ["llama-3.1-8b"], reuse_port=False)
    try:
        cfg = tmp_path / "second.yaml"
        cfg.write_text(f"gateway: {{port: {port}}}\nsimulated:\n  replicas: [{{gpu: H100, model: llama-3.1-8b}}]\n")
        second = subprocess.run(STEERSMAN + ["serve", "--config", str(cfg)], capture_output=True, text=True, timeout=120)
        assert second.returncode != 0
        assert "Traceback" not in second.stderr and str(port) in second.stderr + second.stdout
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(30)
