"""A llama-server whose slots share one KV pool (``--kv-unified``) is read at its real capacity, not n_slots times it.

With ``-kvu`` (and by default when ``-np`` is left to auto: 4 slots, unified; ``tools/server/server.cpp``) every
slot reports the whole pool as its ``n_ctx`` (``server_slot::n_ctx = n_ctx_slot()`` = ``llama_n_ctx_seq``, the
whole context when unified, ``-c / -np`` otherwise; ``tools/server/server-context.cpp`` of the llama.cpp that
llama-cpp-python 0.3.36 vendors).  The adapter summed ``n_ctx`` over the slots: 4x the pool with 4 slots.

Nothing the server serves tells the two layouts apart.  Recorded from that build's llama-server
(~/.cache/steersman/llama.cpp/0.3.36/bin/llama-server, gemma-3-270m-q4_k_m.gguf, ``-t 1 --metrics --no-repack``,
127.0.0.1), after three concurrent 974-token completions (``data/llamacpp_slots_{unified,split}.json``):

* ``-np 4 --kv-unified -c 4096``: log ``initializing, n_slots = 4, n_ctx_slot = 4096, kv_unified = 'true'``;
  ``/slots`` n_ctx 4096, 4096, 4096, 4096 (held 0/974/974/974); ``/props`` ``total_slots`` 4,
  ``default_generation_settings.n_ctx`` 4096.
* ``-c 4096`` (``-np`` auto): the same log line, ``/slots``, ``/props`` (unified, 4 slots).
* ``-np 4 -c 4096``: log ``n_slots = 4, n_ctx_slot = 1024, kv_unified = 'false'``; ``/slots`` n_ctx 1024 x 4 (held
  0/974/974/974); ``/props`` ``total_slots`` 4, ``n_ctx`` 1024.

``/props`` differs between them in ``n_ctx`` only (and the random ``media_marker``): no ``kv_unified``, no pool size;
``/v1/models`` ``meta.n_ctx`` is the slot's too, ``/metrics`` has no KV figure.  So ``-np 4 --kv-unified -c 4096``
and ``-np 4 -c 16384`` serve identical pages, and the layout comes from who knows it:

* the fleet file (``kv_unified: true|false`` on a llama.cpp endpoint) and the replicas steersman starts itself
  (``-np`` given, no ``-kvu``: per-slot), carried to the adapter on :class:`ReplicaAddress`;
* else the smallest pool the page allows: one slot's ``n_ctx`` (the unified reading), until the slots hold more
  tokens together than one slot's context, which only per-slot pools can: the sum from then on (remembered for the
  replica while its slots keep their number and ``n_ctx``).  Under-reading a per-slot server until then errs on
  the safe side; over-reading a unified one sends it work its shared pool cannot hold.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import orjson
import pytest

from steersman.api.errors import error_body
from steersman.engines import LlamaCppAdapter
from steersman.engines.base import ReplicaAddress
from steersman.engines.llamacpp import kv_pool_tokens, llamacpp_metrics, parse_slots
from steersman.fleet.config import FleetConfigError, parse_fleet
from steersman.fleet.processes import LlamaServerFleet
from steersman.http.server import HttpRequest, HttpServer

DATA = Path(__file__).parent / "data"
PAGE = (DATA / "llamacpp_metrics_idle.txt").read_text()


def _raw(tag: str) -> list:
    return json.loads((DATA / f"llamacpp_slots_{tag}.json").read_text())


def _fresh(n_ctx: int) -> list:
    """/slots of a server that has run nothing yet, as recorded (4 slots)."""
    return [{"id": i, "n_ctx": n_ctx, "speculative": False, "is_processing": False} for i in range(4)]


def test_a_unified_pool_is_one_slots_n_ctx():
    slots = parse_slots(_raw("unified"))
    assert [s.n_ctx for s in slots] == [4096] * 4 and sum(s.held_tokens for s in slots) == 3 * 974
    for hint in (True, None):  # declared, or not: 2922 held tokens fit one slot's 4096
        m = llamacpp_metrics(PAGE, slots, block_size=16, kv_unified=hint)
        assert m.kv_blocks_total == 4096 / 16  # was 4 * 4096 / 16
        assert m.slots == 4
    assert parse_slots(_fresh(4096)) and llamacpp_metrics(PAGE, parse_slots(_fresh(4096)), 16).kv_blocks_total == 256


def test_a_unified_pools_usage_is_over_the_pool():
    raw = _raw("unified")
    raw[1]["is_processing"] = raw[2]["is_processing"] = True  # two of the three requests still running
    m = llamacpp_metrics(PAGE, parse_slots(raw), block_size=16, kv_unified=True)
    assert m.kv_usage == pytest.approx(2 * 974 / 4096)  # was 2 * 974 / 16384


def test_per_slot_pools_add_up():
    split = parse_slots(_raw("split"))
    assert [s.n_ctx for s in split] == [1024] * 4
    for hint in (False, None):  # declared, or proven: 2922 tokens held cannot fit one slot's 1024
        assert llamacpp_metrics(PAGE, split, block_size=16, kv_unified=hint).kv_blocks_total == 4096 / 16
    fresh = parse_slots(_fresh(1024))
    assert llamacpp_metrics(PAGE, fresh, block_size=16, kv_unified=False).kv_blocks_total == 4096 / 16
    assert llamacpp_metrics(PAGE, fresh, block_size=16).kv_blocks_total == 1024 / 16  # not known yet: the least


def test_kv_pool_tokens_reads_the_layout():
    unified, split = parse_slots(_raw("unified")), parse_slots(_raw("split"))
    assert kv_pool_tokens(unified, True) == kv_pool_tokens(unified, None) == 4096
    assert kv_pool_tokens(unified, False) == 4 * 4096  # what the operator says goes
    assert kv_pool_tokens(split, None) == kv_pool_tokens(split, False) == 4096
    assert kv_pool_tokens([], None) == 0


# ---- the adapter over HTTP ---------------------------------------------------------------------------------------

class _LlamaServer:
    """llama-server's /metrics and /slots (the slot list replaceable between scrapes)."""

    def __init__(self, slots: list) -> None:
        self.slots = slots
        self.http = HttpServer(error_body, 1 << 20)
        self.http.route("GET", "/metrics", self._metrics)
        self.http.route("GET", "/slots", self._slots)

    async def _metrics(self, request: HttpRequest) -> None:
        request.respond(200, PAGE.encode(), b"text/plain; version=0.0.4")

    async def _slots(self, request: HttpRequest) -> None:
        request.respond(200, orjson.dumps(self.slots))


def _capacities(pages: list[list], kv_unified: bool | None) -> list[float | None]:
    """KV capacity in tokens (16-token blocks) the adapter reads from each /slots page in turn."""
    async def go():
        server = _LlamaServer(pages[0])
        port = await server.http.start("127.0.0.1", 0)
        adapter = LlamaCppAdapter()
        rep = ReplicaAddress("llama", f"http://127.0.0.1:{port}", kv_unified=kv_unified)
        out = []
        try:
            for page in pages:
                server.slots = page
                m = await adapter.scrape(rep)
                out.append(None if m.kv_blocks_total is None else m.kv_blocks_total * 16)
        finally:
            await adapter.close()
            await server.http.stop()
        return out

    return asyncio.run(go())


def test_the_adapter_reads_a_declared_layout():
    assert _capacities([_raw("unified")], kv_unified=True) == [4096]  # was 16384
    assert _capacities([_fresh(1024), _raw("split")], kv_unified=False) == [4096, 4096]


def test_the_adapter_remembers_per_slot_pools_once_proven():
    fresh, busy = _fresh(1024), _raw("split")
    # the least until the slots hold more than one slot's context; then the sum, also once they are emptied
    assert _capacities([fresh, busy, fresh], kv_unified=None) == [1024, 4096, 4096]
    # a restart with other slots (another -c) forgets it
    assert _capacities([busy, _fresh(2048)], kv_unified=None) == [4096, 2048]
    # a unified pool is never taken for per-slot ones
    assert _capacities([_fresh(4096), _raw("unified"), _fresh(4096)], kv_unified=None) == [4096, 4096, 4096]


# ---- who knows the layout: the fleet file, the replicas steersman starts ---------------------------------------------

def test_the_fleet_file_declares_a_unified_llamacpp_endpoint():
    cfg = parse_fleet({"endpoints": [
        {"name": "a", "url": "http://127.0.0.1:8081", "engine": "llamacpp", "kv_unified": True},
        {"name": "b", "url": "http://127.0.0.1:8082", "engine": "llamacpp"}]})
    assert [e.kv_unified for e in cfg.endpoints] == [True, None]
    with pytest.raises(FleetConfigError, match=r"endpoints\[0\]\.kv_unified.*llamacpp"):
        parse_fleet({"endpoints": [{"url": "http://127.0.0.1:8000", "engine": "vllm", "kv_unified": False}]})


def test_the_replicas_steersman_starts_say_their_layout():
    def fleet(*extra: str) -> LlamaServerFleet:
        return LlamaServerFleet(1, binary=Path("/x/llama-server"), model=Path("/m.gguf"), extra_args=extra)

    assert fleet().kv_unified is False  # -np given: llama.cpp's unified default is off
    assert fleet("--kv-unified").kv_unified is True and fleet("-kvu").kv_unified is True
    assert fleet("-kvu", "--no-kv-unified").kv_unified is False  # the last one wins, as llama.cpp parses them


def test_the_replicas_layout_read_from_the_environment_they_inherit(monkeypatch):
    """llama.cpp reads ``LLAMA_ARG_KV_UNIFIED`` when the flag is not given (its boolean spellings); a flag beats it."""
    def fleet(*extra: str) -> LlamaServerFleet:
        return LlamaServerFleet(1, binary=Path("/x/llama-server"), model=Path("/m.gguf"), extra_args=extra)

    for value, unified in (("1", True), ("true", True), ("on", True), ("enabled", True), ("0", False), ("off", False)):
        monkeypatch.setenv("LLAMA_ARG_KV_UNIFIED", value)
        assert fleet().kv_unified is unified, value
    monkeypatch.setenv("LLAMA_ARG_KV_UNIFIED", "1")
    assert fleet("-no-kvu").kv_unified is False  # the command line beats the environment


def test_a_replica_carries_its_layout_to_the_adapter():
    from steersman.fleet.records import Replica

    rep = Replica(0, "a", "http://127.0.0.1:1", "llamacpp", None, ("m",), "default", 0.0, 1, LlamaCppAdapter(),
                  kv_unified=True)
    assert rep.address.kv_unified is True
    assert ReplicaAddress("b", "http://127.0.0.1:2").kv_unified is None
