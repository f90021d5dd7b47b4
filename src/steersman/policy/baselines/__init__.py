"""Baseline routing profiles: honest implementations of published rules on steersman's snapshot.

=====================  ==============================================================
profile                rule
=====================  ==============================================================
``round-robin``        candidate ``k mod n`` for the k-th request of its model
``random``             candidate drawn from a hash of ``seq``
``least-request``      fewest requests in flight from this gateway
``power-of-two``       two candidates drawn from a hash of ``seq``, fewer in flight wins
``sglang-cache-aware`` SGLang router ``cache_aware`` (0.3 / 64 / 1.5)
``llm-d``              llm-d default: prefix 3, queue 2, KV utilization 2, max score
``dynamo-kv``          NVIDIA Dynamo KV router: least prefill + decode blocks
``preble-e2``          Preble's E2 exploit / explore rule
=====================  ==============================================================

None of them queues at the gateway.  Importing this package registers them in
:data:`steersman.policy.base.POLICIES` (and the ``prefix-match`` feature and the
``prefix-match-fraction`` / ``queue-depth`` / ``kv-utilization`` scorers).
"""

from steersman.policy.baselines import common, dynamo, llmd, preble, sglang, simple  # noqa: F401

BASELINES = ("round-robin", "random", "least-request", "power-of-two", "sglang-cache-aware", "llm-d", "dynamo-kv",
             "preble-e2")

__all__ = ["BASELINES"]
