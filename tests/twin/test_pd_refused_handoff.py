"""Prefill/decode disaggregation: a KV hand-off the decode replica refuses fails that request only."""

import math

from steersman.fleet.config import parse_fleet
from steersman.policy import make_policy
from steersman.testing import ReplayWorkload, arrival
from steersman.twin import Twin, TwinConfig, TwinFleet
from steersman.twin.results import FAILED, OK

FLEET = parse_fleet({"simulated": {"replicas": [
    {"gpu": "H100", "model": "llama-3.1-8b", "count": 1, "pool": "p", "role": "prefill"},
    {"gpu": "H100", "model": "llama-3.1-8b", "count": 1, "pool": "d", "role": "decode"}]}})


def test_a_refused_hand_off_leaves_the_decode_replicas_run_going():
    """The refused submit cut the decode run in progress first: the replica must still wake at its new end
    (it stalled, its streams never ending).  The refused request's client saw no first token."""
    tf = TwinFleet.from_config(FLEET)
    limit = tf.replicas[1].engine.max_model_len
    items = [arrival(0.0, 0, prompt_tokens=1000, output_tokens=3000, max_tokens=None),  # decoding meanwhile
             # its prefill fits (prompt + 1 token), its decode does not
             arrival(1.0, 1, prompt_tokens=limit - 2000, output_tokens=3000, max_tokens=None)]
    rec = Twin(tf, ReplayWorkload(items), make_policy("least-request", tf.scheduler),
               cfg=TwinConfig(duration_s=60.0)).run()
    c = rec.arrays()
    assert c["status"].tolist() == [OK, FAILED]
    assert c["output"][0] == 3000 and math.isnan(c["first"][1])
