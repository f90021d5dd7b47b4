"""``steersman engine-sim``: serve one simulated replica."""

from __future__ import annotations

import sys
from dataclasses import replace

import typer

from steersman.config import DEFAULTS, EngineSettings

__all__ = ["register"]

_S = DEFAULTS.sim_server


def register(app: typer.Typer) -> None:
    @app.command("engine-sim")
    def engine_sim(
        gpu: str = typer.Option(_S.gpu, help="GPU profile (H100, A100, H200, B200, L40S, MI300X)."),
        model: str = typer.Option(_S.model, help="Model profile (llama-3.1-8b, llama-3.1-70b, qwen2.5-7b, gemma-3-270m)."),
        port: int = typer.Option(_S.port, help="Port (0 = any free port, printed in the ready line)."),
        host: str = typer.Option(_S.host),
        speedup: float = typer.Option(_S.speedup, help="Divide every delay by this factor."),
        tp: int = typer.Option(DEFAULTS.engine.tensor_parallel, help="Tensor-parallel degree of the replica."),
        served_model_name: str | None = typer.Option(None, help="Model id clients use (default: the profile name)."),
        lora_modules: list[str] = typer.Option(
            [], help="A LoRA adapter served besides the model, as vLLM's --lora-modules NAME=PATH (the path is not "
                     "read; repeat for more): listed in /v1/models with the model as parent, its KV its own."),
        max_num_seqs: int | None = typer.Option(None),
        max_num_batched_tokens: int | None = typer.Option(None),
        max_model_len: int | None = typer.Option(
            None, help="The context length (vLLM's flag; default: the model's). A cache smaller than the model's "
                       "context (70B on 2 GPUs) needs it, as vLLM does."),
        gpu_memory_utilization: float = typer.Option(DEFAULTS.engine.gpu_memory_utilization,
                                                     help="Share of HBM for weights and KV cache (vLLM's flag)."),
        block_size: int = typer.Option(DEFAULTS.engine.block_size, help="Tokens per KV block (vLLM's flag)."),
        enable_prefix_caching: bool = typer.Option(DEFAULTS.engine.enable_prefix_caching,
                                                   help="vLLM's --enable-prefix-caching / --no-enable-prefix-caching."),
        scheduling_policy: str = typer.Option(DEFAULTS.engine.scheduling_policy,
                                              help="fcfs, or priority: requests' `priority` orders the queue "
                                                   "(lower first), as vLLM --scheduling-policy."),
        mean_output_tokens: float = typer.Option(_S.mean_output_tokens, help="Mean answer length when EOS decides."),
        cold_start: bool = typer.Option(False, help="Start with weights cold and load them (load time from weight bytes)."),
        enable_sleep_mode: bool = typer.Option(
            False, help="vLLM's sleep mode (with VLLM_SERVER_DEV_MODE=1): POST /sleep?level=1|2 unloads the weights, "
                        "POST /wake_up loads them again, GET /is_sleeping says which."),
        die_after_tokens: int | None = typer.Option(None, help="Fault: crash after this many streamed tokens."),
        hang: bool = typer.Option(False, help="Fault: make no progress."),
        slowdown: float = typer.Option(1.0, help="Fault: every step takes this factor longer."),
        error_rate: float = typer.Option(0.0, help="Fault: share of requests answered with a 5xx."),
        error_status: int = typer.Option(500, help="Fault: status code of injected errors."),
        refuse_for: float = typer.Option(0.0, help="Fault: refuse connections for this many seconds at start."),
        admin_key_sha256: str | None = typer.Option(None, envvar="STEERSMAN_SIM_ADMIN_KEY_SHA256",
                                                    help="Require the key with this SHA-256 hex as bearer key on /admin."),
        otlp_traces_endpoint: str | None = typer.Option(
            None, help="Export an llm_request span per request (vLLM's flag): an OTLP/HTTP traces URL."),
        kv_events_endpoint: str | None = typer.Option(
            None, help="Publish the prefix cache's changes as vLLM's KV events on a ZMQ PUB socket bound here "
                       "(tcp://HOST:PORT; PORT * takes a free one, printed in the ready line)."),
        kv_events_topic: str = typer.Option("", help="Topic of the KV event messages (vLLM's default: none)."),
        kv_events_replay_endpoint: str | None = typer.Option(
            None, help="Answer replay requests for the last KV event batches (sim_server.kv_events_buffer_steps) on a "
                       "ZMQ ROUTER socket bound here (vLLM's replay_endpoint; PORT * takes a free one, printed in the ready line)."),
    ) -> None:
        """Serve one simulated GPU replica over an OpenAI-compatible HTTP API."""
        from steersman.cli._run import exit_if_cannot_listen, run_service
        from steersman.enginesim.app import SimServer, SimServerConfig
        from steersman.enginesim.faults import FaultSpec

        faults = FaultSpec(
            die_after_tokens=die_after_tokens,
            hang=hang,
            slowdown=slowdown,
            error_rate=error_rate,
            error_status=error_status,
            refuse_for_s=refuse_for,
        )
        try:
            faults.validate()
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        if not 0 <= port <= 65535:
            raise typer.BadParameter(f"--port must be 0 to 65535 (0: any free port), got {port}")
        if otlp_traces_endpoint is not None and not otlp_traces_endpoint.startswith(("http://", "https://")):
            raise typer.BadParameter(f"--otlp-traces-endpoint must be an http(s) URL, got {otlp_traces_endpoint!r}")
        for flag, value in (("--kv-events-endpoint", kv_events_endpoint),
                            ("--kv-events-replay-endpoint", kv_events_replay_endpoint)):
            if value is not None and not value.startswith(("tcp://", "ipc://")):
                raise typer.BadParameter(f"{flag} must be a tcp:// or ipc:// ZMQ endpoint, got {value!r}")
        if kv_events_replay_endpoint is not None and kv_events_endpoint is None:
            raise typer.BadParameter("--kv-events-replay-endpoint needs --kv-events-endpoint")
        if scheduling_policy not in ("fcfs", "priority"):
            raise typer.BadParameter(f"--scheduling-policy must be fcfs or priority, got {scheduling_policy!r}")
        try:  # the settings objects check the values (bounds, finite): an error naming the flag, not a traceback
            replace(_S, host=host, port=port, speedup=speedup, mean_output_tokens=mean_output_tokens)
            engine = replace(EngineSettings(), tensor_parallel=tp, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens, scheduling_policy=scheduling_policy,
                             max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
                             block_size=block_size, enable_prefix_caching=enable_prefix_caching)
        except ValueError as e:
            raise typer.BadParameter(_as_flag(str(e))) from None
        cfg = SimServerConfig(
            gpu=gpu, model=model, host=host, port=port, speedup=speedup, served_model_name=served_model_name,
            mean_output_tokens=mean_output_tokens, engine=engine, cold_start=cold_start, faults=faults,
            admin_key_sha256=admin_key_sha256, exit_on_crash=True, otlp_traces_endpoint=otlp_traces_endpoint,
            kv_events_endpoint=kv_events_endpoint, kv_events_topic=kv_events_topic,
            kv_events_replay_endpoint=kv_events_replay_endpoint, sleep_mode=enable_sleep_mode,
            lora_modules=tuple(dict.fromkeys(m.split("=", 1)[0] for m in lora_modules if m.split("=", 1)[0])),
        )
        try:
            server = SimServer(cfg)
        except (KeyError, ValueError) as e:
            typer.echo(f"engine-sim: {e}", err=True)
            raise typer.Exit(2) from None

        async def start() -> None:
            await server.start()
            if refuse_for > 0:
                import asyncio

                asyncio.get_running_loop().create_task(server.refuse(refuse_for))
            ev = server.kv_events
            events = "" if ev is None else f" kv_events={ev.endpoint}" + (
                f" kv_events_replay={ev.replay_endpoint}" if ev.replay_endpoint else "")
            print(f"engine-sim ready {server.url} model={server.model_name} gpu={gpu} speedup={speedup}{events}", flush=True)

        try:
            run_service(start, server.stop, freeze=DEFAULTS.gateway.gc_freeze)  # the gateway's process policy
        except OSError as e:
            exit_if_cannot_listen("engine-sim", e)
            raise
        sys.exit(0)


#: settings fields whose flag is not the field's name with dashes
_FLAGS = {"tensor_parallel": "tp"}


def _as_flag(message: str) -> str:
    """A settings error (``tensor_parallel must be >= 1, got 0``) as the flag the user typed (``--tp must ...``)."""
    field, _, rest = message.partition(" ")
    return f"--{_FLAGS.get(field, field).replace('_', '-')} {rest}"
