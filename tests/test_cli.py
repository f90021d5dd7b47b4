"""The commands a user types: `steersman up`, `serve`, `engine-sim`, `defaults`."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

STEERSMAN = [sys.executable, "-m", "steersman"]


def _wait_line(proc: subprocess.Popen, prefix: str, timeout: float = 60.0, seen: list[str] | None = None) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"process exited ({proc.poll()}) before printing {prefix!r}")
        if seen is not None:
            seen.append(line)
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no {prefix!r} line within {timeout} s")


def test_up_serves_openai_clients_and_stops_everything_on_ctrl_c():
    from openai import OpenAI

    proc = subprocess.Popen(STEERSMAN + ["up", "--port", "0", "--speedup", "20"], stdout=subprocess.PIPE, text=True)
    try:
        printed: list[str] = []
        url = _wait_line(proc, "steersman ready", seen=printed).split()[-1]
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) == 5  # 2x H100 + 2x A100 + 1x L40S engine-sim replicas
        with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
            assert sorted(m.id for m in client.models.list().data) == ["llama-3.1-8b", "qwen2.5-7b"]
            text = "".join(
                c.choices[0].delta.content or ""
                for c in client.chat.completions.create(
                    model="llama-3.1-8b", stream=True, max_tokens=8, messages=[{"role": "user", "content": "Hello!"}]
                )
            )
            assert text
        # the ready-to-paste Python example, pasted (a streamed chat, then a Response)
        out = "".join(printed)
        example = out[out.index("# python\n") + len("# python\n"):].split("\n\n")[0]
        ran = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0 and len(ran.stdout.strip().splitlines()) == 1, ran.stderr
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_rejects_a_bad_fleet_file_clearly(tmp_path):
    bad = tmp_path / "fleet.yaml"
    bad.write_text("endpoints:\n  - {url: 'ftp://x', engine: vllm}\n")
    r = subprocess.run(STEERSMAN + ["serve", "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "endpoints[0].url" in r.stderr and "Traceback" not in r.stderr
    bad.write_text("endpoints:\n  - {url: 'http://127.0.0.1:9', engine: vlm, models: [m]}\n")
    r = subprocess.run(STEERSMAN + ["serve", "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "endpoints[0].engine: unknown engine 'vlm'" in r.stderr and "Traceback" not in r.stderr
    bad.write_text("gateway: {prot: 1}\nsimulated: {replicas: [{gpu: H100, model: llama-3.1-8b}]}\n")
    r = subprocess.run(STEERSMAN + ["serve", "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "prot" in r.stderr


def test_engine_sim_command_prints_ready_and_rejects_unknown_gpu():
    proc = subprocess.Popen(STEERSMAN + ["engine-sim", "--gpu", "H100", "--model", "llama-3.1-8b", "--port", "0", "--speedup", "10"], stdout=subprocess.PIPE, text=True)
    try:
        line = _wait_line(proc, "engine-sim ready")
        assert "http://127.0.0.1:" in line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    r = subprocess.run(STEERSMAN + ["engine-sim", "--gpu", "TPU9", "--port", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "TPU9" in r.stderr and "H100" in r.stderr


def test_defaults_command_lists_sources():
    r = subprocess.run(STEERSMAN + ["defaults"], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0 and "gateway.max_body_bytes" in r.stdout and "vLLM" in r.stdout


_FREEZE_PROBE = """
import asyncio, gc, os, signal, sys
from steersman.cli._run import run_service

async def start():
    def probe():
        print("frozen", gc.get_freeze_count(), "threshold0", gc.get_threshold()[0], flush=True)
        os.kill(os.getpid(), signal.SIGINT)
    asyncio.get_running_loop().call_later(0.05, probe)

async def stop():
    print("stopped", flush=True)

run_service(start, stop, freeze=sys.argv[1] == "1", gc_threshold0=int(sys.argv[2]) if len(sys.argv) > 2 else None)
"""


@pytest.mark.parametrize("freeze", [True, False])
def test_a_started_service_freezes_its_heap_out_of_the_collector(freeze):
    # gateway.gc_freeze: what start-up allocated (imports, kernels, config) leaves the collector's full passes
    r = subprocess.run([sys.executable, "-c", _FREEZE_PROBE, "1" if freeze else "0"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    frozen = int(r.stdout.split("frozen")[1].split()[0])
    assert (frozen > 1000) if freeze else frozen == 0, r.stdout
    assert "stopped" in r.stdout


def test_a_started_service_sets_the_young_collection_threshold():
    # gateway.gc_threshold0: set once started; None leaves Python's own (what a fresh interpreter has)
    own = int(subprocess.run([sys.executable, "-c", "import gc; print(gc.get_threshold()[0])"], capture_output=True,
                             text=True, timeout=60).stdout)
    for arg, want in ((["12345"], 12345), ([], own)):
        r = subprocess.run([sys.executable, "-c", _FREEZE_PROBE, "1", *arg], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert int(r.stdout.split("threshold0")[1].split()[0]) == want, r.stdout


def test_the_gateway_refuses_a_young_collection_threshold_below_one(tmp_path):
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text("gateway: {gc_threshold0: 0}\nendpoints:\n  - {url: 'http://127.0.0.1:9', models: [m]}\n")
    r = subprocess.run(STEERSMAN + ["serve", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "gc_threshold0" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_gateway_refuses_a_negative_busy_poll_window(tmp_path):
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text("gateway: {busy_poll_s: -0.5}\nendpoints:\n  - {url: 'http://127.0.0.1:9', models: [m]}\n")
    r = subprocess.run(STEERSMAN + ["serve", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "busy_poll_s" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_taken_port_or_a_bad_flag_is_a_clear_error(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = str(s.getsockname()[1])
        fleet = tmp_path / "fleet.yaml"
        fleet.write_text("simulated: {replicas: [{gpu: H100, model: llama-3.1-8b}]}\n")
        for argv, who in ((["serve", "--config", str(fleet), "--port", port], "steersman serve"),
                          (["engine-sim", "--gpu", "H100", "--port", port], "engine-sim")):
            r = subprocess.run(STEERSMAN + argv, capture_output=True, text=True, timeout=60)
            assert r.returncode == 2 and f"{who}: cannot listen" in r.stderr and "address already in use" in r.stderr
            assert "Traceback" not in r.stderr
    for argv, says in ((["up", "--speedup", "0"], "--speedup must be > 0"), (["up", "--port", "70000"], "0 to 65535"),
                       (["engine-sim", "--gpu", "H100", "--port", "70000"], "0 to 65535")):
        r = subprocess.run(STEERSMAN + argv, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "COLUMNS": "200"})
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr


_SLOW_START_PROBE = """
import asyncio
from steersman.cli._run import run_service

async def start():
    print("starting", flush=True)
    try:
        await asyncio.sleep(600)  # engines loading
    except asyncio.CancelledError:
        print("start cancelled", flush=True)
        raise
    print("started", flush=True)

async def stop():
    print("stopped", flush=True)

run_service(start, stop, freeze=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_slow_start_cancels_it_and_stops(sig):
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_START_PROBE], stdout=subprocess.PIPE, text=True)
    try:
        _wait_line(proc, "starting")
        proc.send_signal(sig)
        assert proc.wait(20) == 0
        assert proc.stdout.read().split("\n")[:2] == ["start cancelled", "stopped"]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_while_engines_load_stops_them_and_exits(tmp_path):
    # `up --engines llamacpp:1` whose llama-server never gets healthy (a model that loads for minutes)
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\nexec sleep 600\n")
    fake.chmod(0o755)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    env = {**os.environ, "STEERSMAN_LLAMA_SERVER": str(fake), "STEERSMAN_GGUF": str(gguf)}
    proc = subprocess.Popen(STEERSMAN + ["up", "--engines", "llamacpp:1", "--port", "0"], stderr=subprocess.PIPE,
                            text=True, env=env)
    engines: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while not engines:
            assert proc.poll() is None and time.monotonic() < deadline, "its llama-server was never started"
            engines = psutil.Process(proc.pid).children()
            time.sleep(0.05)  # polling another process: no clock to inject
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
        _, alive = psutil.wait_procs(engines, timeout=10)
        assert not alive
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in engines:
            if p.is_running():
                p.kill()


# ---- flags and fleet-file values refused with one line, never a traceback ---------------------------------------

def _invoke(argv: list[str], **env: str):
    """The command run in-process (typer's runner: not a terminal), for what it refuses before starting."""
    from typer.testing import CliRunner

    from steersman.cli import app

    return CliRunner().invoke(app, argv, env={"COLUMNS": "200", **env})


@pytest.mark.parametrize("argv, says", [
    (["engine-sim", "--tp", "0"], "--tp must be >= 1, got 0"),  # each a traceback
    (["engine-sim", "--block-size", "0"], "--block-size must be >= 1, got 0"),
    (["engine-sim", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be > 0, <= 1, got 1.5"),
    (["engine-sim", "--max-model-len", "0"], "--max-model-len must be >= 1, got 0"),
    (["engine-sim", "--max-num-seqs", "0"], "--max-num-seqs must be >= 1, got 0"),
    (["engine-sim", "--max-num-batched-tokens", "-5"], "--max-num-batched-tokens must be >= 1, got -5"),
    (["engine-sim", "--mean-output-tokens", "nan"], "--mean-output-tokens must be a finite number > 0"),  # accepted
    (["engine-sim", "--mean-output-tokens", "-5"], "--mean-output-tokens must be > 0"),
    (["engine-sim", "--speedup", "inf"], "--speedup must be a finite number > 0"),
    (["engine-sim", "--host", ""], "--host must be an address"),  # listened on every interface
    (["up", "--speedup", "inf"], "--speedup must be > 0 and finite, got inf"),  # accepted
    (["up", "--host", ""], "--host must be an address"),
    (["plan", "--headroom", "nan", "--workload", "w.yaml"], "--headroom must be a finite number >= 0"),  # accepted
    (["plan", "--headroom", "inf", "--workload", "w.yaml"], "--headroom must be a finite number >= 0"),
])
def test_a_flag_value_the_settings_refuse_is_named_before_anything_starts(argv, says, monkeypatch):
    def run_service(*args, **kwargs):
        raise AssertionError("the command started its service")  # (accepted: it would serve until killed)

    monkeypatch.setattr("steersman.cli._run.run_service", run_service)
    r = _invoke(argv)
    assert r.exit_code == 2 and says in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception


def test_defaults_piped_never_cuts_a_setting_name():
    from steersman.config import DEFAULTS, sources

    r = _invoke(["defaults"], COLUMNS="80")  # piped into grep or less: rich assumed 80 columns, 126 names cut
    assert r.exit_code == 0 and "…" not in r.output
    missing = [name for name in sources(DEFAULTS) if f"│ {name} " not in r.output]
    assert not missing


@pytest.mark.parametrize("gateway, says", [
    ("{admin_key_sha256: notahash}", "gateway.admin_key_sha256 must be the SHA-256 hex digest"),
    ("{response_store_url: 'http://x'}", "gateway.response_store_url must be a redis://"),
    ("{limits_url: 'http://x'}", "gateway.limits_url must be a redis://"),
])
def test_serve_refuses_a_value_start_up_used_to_trip_on(tmp_path, gateway, says):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"gateway: {gateway}\nendpoints: [{{url: 'http://127.0.0.1:9', models: [m]}}]\n")
    r = subprocess.run(STEERSMAN + ["serve", "--config", str(fleet), "--port", "0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and f"steersman serve: {fleet}: {says}" in r.stderr and "Traceback" not in r.stderr, \
        r.stderr


def test_serve_refuses_more_engine_sims_than_it_starts(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("simulated: {replicas: [{gpu: H100, model: llama-3.1-8b, count: 100000}]}\n")
    r = subprocess.run(STEERSMAN + ["serve", "--config", str(fleet)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "100,000 engine-sim processes" in r.stderr and "Traceback" not in r.stderr


def test_a_host_that_does_not_resolve_is_a_clear_error(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("gateway: {calibrate_unprofiled: false}\nendpoints: [{url: 'http://127.0.0.1:9', models: [m]}]\n")
    r = subprocess.run(STEERSMAN + ["serve", "--config", str(fleet), "--port", "0", "--host", "nosuchhost.invalid"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "steersman serve: cannot listen: the host does not resolve" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_an_engine_sim_that_exits_before_it_is_ready_is_a_one_line_error(tmp_path):
    # every engine-sim the gateway spawns exits at once (a broken install, a killed child): was a traceback
    (tmp_path / "sitecustomize.py").write_text("import os, sys\nif 'engine-sim' in sys.argv:\n    os._exit(3)\n")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("simulated: {replicas: [{gpu: H100, model: llama-3.1-8b}]}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run(STEERSMAN + ["serve", "--config", str(fleet), "--port", "0"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2, r.stderr
    assert "steersman serve: engine-sim h100-sxm-0 exited before it was ready (code 3)" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_a_value_the_gateway_refuses_while_starting_is_a_one_line_error(capsys):
    # a configuration built past the fleet file's checks (the fleet file refuses this one now): the ValueError
    # Gateway raises in start() is `command: message`, exit 2
    import dataclasses

    import msgspec
    import typer

    from steersman.cli.gateway_cmd import _run
    from steersman.fleet.config import parse_fleet

    cfg = parse_fleet({"endpoints": [{"url": "http://127.0.0.1:9", "models": ["m"]}], "gateway": {"gc_freeze": False}})
    adm = cfg.admission
    bad = object.__new__(type(adm))
    for f in dataclasses.fields(adm):
        object.__setattr__(bad, f.name, getattr(adm, f.name))
    object.__setattr__(bad, "default_priority", "bogus")
    with pytest.raises(typer.Exit) as e:
        _run(msgspec.structs.replace(cfg, admission=bad), "steersman serve")
    assert e.value.exit_code == 2
    err = capsys.readouterr().err
    assert "steersman serve: " in err and "bogus" in err, err


def test_the_banners_examples_work_as_pasted_when_api_keys_are_configured():
    """With keys configured the examples sent api_key="unused": pasted, each was a 401 (state audit)."""
    from steersman.cli.gateway_cmd import examples
    from steersman.control import generate_key
    from steersman.enginesim.app import SimServerConfig
    from steersman.testing import LiveFleet

    key, digest = generate_key()
    extra = {"tenants": {"t": {}}, "api_keys": [{"sha256": digest, "tenant": "t"}]}
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], extra=extra) as lf:
        env = {**os.environ, "STEERSMAN_API_KEY": key}
        curl, py = examples(lf.url, "llama-3.1-8b", keyed=True)
        ran = subprocess.run([sys.executable, "-c", py], capture_output=True, text=True, timeout=60, env=env)
        assert ran.returncode == 0 and len(ran.stdout.strip().splitlines()) == 1, ran.stderr
        got = subprocess.run(["bash", "-c", curl + " -sS -w '\\n%{http_code}'"], capture_output=True, text=True,
                             timeout=60, env=env)
        assert got.stdout.rstrip().endswith("200") and "data: [DONE]" in got.stdout, got.stdout[-300:]
        _, open_py = examples(lf.url, "llama-3.1-8b", keyed=False)  # what the banner printed before
        ran = subprocess.run([sys.executable, "-c", open_py], capture_output=True, text=True, timeout=60, env=env)
        assert ran.returncode != 0 and "401" in ran.stderr


def test_engine_sim_takes_vllms_sizing_flags():
    """An engine-sim audit: 70B on 2 H100s exited "lower max_model_len" (its KV cache holds ~30k tokens of the
    model's 131k context), with no --max-model-len to lower it, as vLLM needs there too."""
    proc = subprocess.Popen(STEERSMAN + ["engine-sim", "--model", "llama-3.1-70b", "--tp", "2", "--port", "0",
                                         "--max-model-len", "8192", "--gpu-memory-utilization", "0.95",
                                         "--no-enable-prefix-caching"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = _wait_line(proc, "engine-sim ready").split()[2]
        import httpx

        assert httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["max_model_len"] == 8192
    finally:
        proc.terminate()
        proc.wait(timeout=30)


_DRAIN_PROBE = """
import asyncio, os, signal, sys
from steersman.cli._run import run_service

SIGS = [getattr(signal, s) for s in sys.argv[1].split(",")]

async def start():
    def fire():
        for s in SIGS:  # sent together: the loop handles them in one turn, before the drain begins
            os.kill(os.getpid(), s)
    asyncio.get_running_loop().call_later(0.05, fire)

async def drain():
    print("draining", flush=True)
    try:
        await asyncio.sleep(600 if len(SIGS) > 1 else 0)  # streams in flight
    except asyncio.CancelledError:
        print("drain cut", flush=True)
        raise
    print("drained", flush=True)

async def stop():
    print("stopped", flush=True)

run_service(start, stop, freeze=False, drain=drain)
"""


@pytest.mark.parametrize("sigs, want", [
    ("SIGTERM", ["draining", "drained", "stopped"]),
    ("SIGHUP", ["draining", "drained", "stopped"]),  # the terminal closed: drained as a Ctrl-C is
    ("SIGTERM,SIGINT", ["stopped"]),  # two signals before the drain began: no drain (was: it ran to its end)
])
def test_one_signal_drains_then_stops_and_two_stop_at_once(sigs, want):
    r = subprocess.run([sys.executable, "-c", _DRAIN_PROBE, sigs], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == want
