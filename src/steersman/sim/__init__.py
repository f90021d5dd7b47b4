"""Engine model: a pure, clock-free model of one LLM serving replica (a vLLM v1 instance).

* :mod:`~steersman.sim.gpus`, :mod:`~steersman.sim.models`: hardware and model profiles.
* :mod:`~steersman.sim.roofline`: calibrated step-time model (also usable alone to
  predict a hypothetical batch).
* :mod:`~steersman.sim.kvcache` (+ :mod:`~steersman.sim.kvextras`: introspection and
  the per-call vLLM API), :mod:`~steersman.sim.scheduler`: vLLM v1's paged KV cache
  with prefix caching and its continuous-batching scheduler.
* :mod:`~steersman.sim.engine`: :class:`EngineModel`, driven step by step with
  ``now`` passed in (its parts: :mod:`~steersman.sim.decodeset`, the lazy running
  set; :mod:`~steersman.sim.weights`; :mod:`~steersman.sim.engine_types`, what it
  reports); :mod:`~steersman.sim.macro` and :mod:`~steersman.sim.decoderuns`:
  closed-form runs of decode steps (:class:`DecodePlan`, :class:`MacroStep`).
"""

from steersman.sim.engine import EngineModel, EngineState, StepResult, WeightsState
from steersman.sim.gpus import GPUS, GpuProfile, gpu_profile
from steersman.sim.kvcache import KVPool
from steersman.sim.macro import DecodePlan, MacroStep
from steersman.sim.memory import batch_limits, num_kv_blocks, replica_capacity
from steersman.sim.models import MODELS, ModelProfile, model_profile
from steersman.sim.request import SimRequest
from steersman.sim.roofline import Roofline, StepCost, linear_layer_time, predict_step

__all__ = [
    "EngineModel",
    "SimRequest",
    "StepResult",
    "EngineState",
    "WeightsState",
    "MacroStep",
    "DecodePlan",
    "GpuProfile",
    "ModelProfile",
    "gpu_profile",
    "replica_capacity",
    "model_profile",
    "GPUS",
    "MODELS",
    "KVPool",
    "Roofline",
    "StepCost",
    "predict_step",
    "linear_layer_time",
    "batch_limits",
    "num_kv_blocks",
]
