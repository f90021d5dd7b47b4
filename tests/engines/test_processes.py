"""Starting engine processes: failures are explained, nothing is left running."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from steersman.fleet.processes import EngineStartError, LlamaServerFleet, find_llama_server


def test_missing_binary_says_how_to_build_it(monkeypatch, tmp_path):
    monkeypatch.setenv("STEERSMAN_LLAMA_SERVER", str(tmp_path / "nope"))
    assert find_llama_server() is None
    with pytest.raises(EngineStartError, match="make llama"):
        asyncio.run(LlamaServerFleet(1, model=tmp_path / "m.gguf").start())


def test_engine_that_exits_at_start_is_reported_with_its_log(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    fleet = LlamaServerFleet(2, binary=Path("/bin/false"), model=gguf)
    with pytest.raises(EngineStartError, match="exited with 1"):
        asyncio.run(fleet.start())
    assert all(not p.alive() for p in fleet.procs)


def test_command_carries_the_flags_that_matter():
    cmd = LlamaServerFleet(1, binary=Path("/x/llama-server"), model=Path("/m.gguf")).command(1234)
    for flag in ("--metrics", "--slots", "--swa-full", "--jinja", "--no-repack"):
        assert flag in cmd
    template = Path(cmd[cmd.index("--chat-template-file") + 1])
    assert template.is_file() and template.name == "gemma3-chat.jinja" and "<start_of_turn>" in template.read_text()
    assert cmd[cmd.index("-np") + 1] == "4" and cmd[cmd.index("--port") + 1] == "1234"


def test_up_without_a_built_engine_is_a_clear_error(tmp_path):
    env = {**os.environ, "STEERSMAN_LLAMA_SERVER": str(tmp_path / "nope")}
    r = subprocess.run([sys.executable, "-m", "steersman", "up", "--engines", "llamacpp:1", "--port", "0"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "make llama" in r.stderr and "Traceback" not in r.stderr


def test_chat_template_is_the_shipped_file_by_name_or_a_path_as_given():
    from dataclasses import replace

    from steersman.config import DEFAULTS
    from steersman.fleet import processes
    from steersman.fleet.processes import chat_template_path

    assert chat_template_path() == Path(processes.__file__).with_name("gemma3-chat.jinja")
    assert chat_template_path(replace(DEFAULTS.llamacpp, chat_template="/x/t.jinja")) == Path("/x/t.jinja")
    assert chat_template_path(replace(DEFAULTS.llamacpp, chat_template="absent.jinja")) == Path("absent.jinja")


def test_a_replica_that_exits_while_serving_is_reaped_and_named_once(tmp_path, caplog):
    """A llama.cpp audit: a killed llama-server stayed a zombie of steersman's, unnamed, until steersman stopped."""
    import logging

    from steersman.fleet.processes import EngineProcess
    from steersman.testing import FakeClock

    log = tmp_path / "engine.log"
    log.write_text("ggml: out of memory")
    proc = subprocess.Popen(["/bin/sh", "-c", "exit 3"])
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # it exited and is not reaped yet: a zombie
    fleet = LlamaServerFleet(1, binary=Path("/x/llama-server"), model=Path("/m.gguf"), clock=FakeClock())
    fleet.procs = [EngineProcess("llamacpp-0", "127.0.0.1", 1, proc, log)]

    async def run():
        task = asyncio.create_task(fleet.watch())
        await asyncio.sleep(0)  # its first pass
        await fleet.clock.advance(3.0)  # three more: it is named once
        task.cancel()

    with caplog.at_level(logging.WARNING, logger="steersman.engines"):
        asyncio.run(run())
    assert proc.returncode == 3  # reaped
    told = [r.getMessage() for r in caplog.records if "exited with code 3" in r.getMessage()]
    assert len(told) == 1 and "llamacpp-0" in told[0] and "out of memory" in told[0]
