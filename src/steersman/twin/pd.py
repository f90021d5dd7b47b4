"""Prefill/decode disaggregation in the twin: separate pools, the KV cache moved between them.

A fleet declares replicas with ``role: prefill`` and ``role: decode`` (``both``, the
default, serves requests whole).  The routing policy places each request on a
prefill (or ``both``) replica, exactly as it would live; on a prefill replica it
runs as a prefill-only request (``max_output = 1``: the prompt is computed, the
first token sampled, the blocks freed -- its prompt blocks stay in that replica's
prefix cache).  Its KV then moves to a decode replica of the same model:

    transfer_s = prompt tokens x model KV bytes per token / link bandwidth

with the link ``kv_link_gbit_s`` per GPU (default ``DEFAULTS.engine.kv_link_gbit_s``,
400 Gb/s: one ConnectX-7 NDR NIC per GPU, as in a DGX H100) and the shards of a
tensor-parallel replica moving in parallel (bandwidth x the smaller TP of the two
sides).  The request then joins the decode replica as ``kv_ready``
(:class:`~steersman.sim.SimRequest`): admission allocates its blocks without
computing them, and it decodes from its second token.  Its first token reaches the
client when the KV has arrived (TTFT = queueing + prefill + transfer); TPOT is
measured from there, as for a colocated request.

The decode replica is chosen by the control plane, as the prefill one: the decode
picker named by the scheduler setting ``decode_picker`` (:mod:`steersman.policy.decode`,
default ``least-loaded``: the fewest requests handed to it and not finished, lowest
index on ties), a pure function of the fleet snapshot, in which decode replicas are
listed under ``<model>@decode``.  The fleet accounts the request where its work is:
on the prefill replica until its KV reaches the decode replica (the client's first
token: that replica learns its TTFT, transfer included, and its prefix hit), and on
the decode replica from the pick until the request ends
(:meth:`~steersman.control.accounting.Accounting.handed_off`).  A KV transfer that reaches a dead
decode replica fails the request and marks the replica unhealthy (passive
detection, as a failed connection does live).  Simplifications: the prefill side
frees its blocks when the prefill step ends (a real one holds them until the
transfer completes), and the transfer does not wait for blocks on the decode side
(it queues there once arrived).
"""

from __future__ import annotations

from steersman.sim import model_profile

__all__ = ["Disaggregation", "handoff_s_per_token"]


def handoff_s_per_token(model: str, tp: int, link_gbit_s: float) -> float:
    """Seconds to move one prompt token's KV over ``tp`` links of ``link_gbit_s`` (a replica's shards in parallel)."""
    return model_profile(model).kv_bytes_per_token / (link_gbit_s * 1e9 / 8 * tp)


class Disaggregation:
    """Roles and KV transfer times of a disaggregated :class:`~steersman.twin.fleet.TwinFleet`."""

    __slots__ = ("roles", "tp", "link_gbit_s")

    def __init__(self, tf) -> None:
        plans = tf.plans
        self.roles = [p.role for p in plans]
        self.tp = [p.tp for p in plans]
        self.link_gbit_s = tf.kv_link_gbit_s
        if not self.link_gbit_s > 0:
            raise ValueError(f"kv_link_gbit_s must be > 0, got {tf.kv_link_gbit_s}")
        decoded = {p.model for p in plans if p.role == "decode"}
        for p in plans:
            if p.role == "prefill" and p.model not in decoded:
                raise ValueError(f"prefill replica {p.name} ({p.model}) has no decode replica of its model")

    def is_prefill(self, i: int) -> bool:
        return self.roles[i] == "prefill"

    def transfer_s(self, model: str, prompt_tokens: int, src: int, dst: int) -> float:
        """Seconds to move ``prompt_tokens`` tokens of KV from replica ``src`` to ``dst``."""
        return prompt_tokens * handoff_s_per_token(model, min(self.tp[src], self.tp[dst]), self.link_gbit_s)
