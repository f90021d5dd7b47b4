"""SIGTERM / Ctrl-C on `steersman serve`: a graceful shutdown (gateway.drain_timeout_s).  The listener closes, the
streams in flight run to their last token through the engines (which a terminal's Ctrl-C does not reach: they run in
their own session), then everything stops; a second signal, or the drain's timeout, cuts what is left."""

import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from tests.gateway.conftest import serve_process



def _serve(tmp_path, drain_timeout_s: float) -> tuple[subprocess.Popen, str]:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(f"gateway: {{port: 0, drain_timeout_s: {drain_timeout_s}}}\n"
                   "simulated:\n  speedup: 1.0\n  replicas: [{gpu: H100, model: llama-3.1-8b}]\n")
    return serve_process(cfg, tmp_path / "gateway.log")


class _Stream(threading.Thread):
    """One streamed chat through the official client, in the background: its tokens, its end, or its error."""

    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.first = threading.Event()
        self.pieces: list[str] = []
        self.finish: str | None = None
        self.usage = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from openai import OpenAI

        try:
            with OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
                for c in client.chat.completions.create(
                        model="llama-3.1-8b", stream=True, max_tokens=self.max_tokens,
                        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
                        messages=[{"role": "user", "content": "Tell me."}]):
                    if c.usage is not None:
                        self.usage = c.usage
                    for ch in c.choices:
                        if ch.delta.content:
                            self.pieces.append(ch.delta.content)
                            self.first.set()
                        if ch.finish_reason:
                            self.finish = ch.finish_reason
        except BaseException as e:  # noqa: BLE001 (the cut stream's error is what the test reads)
            self.error = e
        finally:
            self.first.set()


def _refused(url: str) -> bool:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return False
    except OSError:
        return True


def _wait(pred, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_ctrl_c_lets_the_stream_in_flight_finish_then_stops(tmp_path):
    proc, url = _serve(tmp_path, 60)
    try:
        s = _Stream(url, 1000)  # ~8 s at real speed on an H100 model: still streaming when the signal lands
        s.start()
        assert s.first.wait(30) and s.error is None
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: to the gateway's whole process group
        assert _wait(lambda: _refused(url))  # no new connections while draining
        s.join(60)
        assert s.error is None, s.error
        assert s.finish == "length" and s.usage.completion_tokens == 1000  # every token, the end, the usage
        assert proc.wait(30) == 0
        log = (tmp_path / "gateway.log").read_text()
        assert "draining" in log and "still open are cut" not in log
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("how", ["drain timeout", "second signal"])
def test_the_drain_is_cut_short_by_its_timeout_or_a_second_signal(tmp_path, how):
    proc, url = _serve(tmp_path, 0.5 if how == "drain timeout" else 600)
    try:
        s = _Stream(url, 4000)  # ~30 s at real speed: longer than the test waits
        s.start()
        assert s.first.wait(30) and s.error is None
        proc.send_signal(signal.SIGTERM)
        if how == "second signal":
            assert _wait(lambda: _refused(url))  # draining
            assert s.is_alive() and s.error is None  # not cut by the first
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0  # long before the stream would have ended
        s.join(20)
        assert s.error is not None or s.finish is None  # the stream was cut, not ended
        assert len(s.pieces) < 4000
        if how == "drain timeout":
            assert "still open are cut" in (tmp_path / "gateway.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
