"""Model profiles: the shape numbers of a dense decoder-only transformer.

Values are those of each model's Hugging Face ``config.json``:

* meta-llama/Llama-3.1-8B(-Instruct): hidden_size 4096, intermediate_size 14336,
  num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, head_dim 128,
  vocab_size 128256, max_position_embeddings 131072, untied embeddings;
  8,030,261,248 parameters (model card / safetensors index).
* meta-llama/Llama-3.1-70B(-Instruct): hidden 8192, intermediate 28672, 80 layers,
  64 heads, 8 KV heads, head_dim 128, vocab 128256, 131072 positions; 70,553,706,496.
* Qwen/Qwen2.5-7B(-Instruct): hidden 3584, intermediate 18944, 28 layers, 28 heads,
  4 KV heads, head_dim 128, vocab 152064, max_position_embeddings 32768 (131072 with
  YaRN, off by default), untied; 7,615,616,512 (QKV biases included).
* google/gemma-3-270m(-it): hidden 640, intermediate 2048, 18 layers, 4 heads, 1 KV
  head, head_dim 256, vocab 262144, max_position_embeddings 32768, tied embeddings;
  268,098,176.  Five of every six layers use a 512-token sliding window; this profile
  treats every layer as global attention (KV and attention cost are overestimated
  for long contexts).
* meta-llama/Llama-2-7b-hf: hidden 4096, intermediate 11008, 32 layers, 32 heads,
  32 KV heads, head_dim 128, vocab 32000, max_position_embeddings 4096;
  6,738,415,616.  Used to calibrate the roofline against Vidur's profiles.

All use a gated MLP (SwiGLU / GeGLU: gate, up and down projections) and BF16 weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["ModelProfile", "MODELS", "model_profile"]


@dataclass(frozen=True, slots=True)
class ModelProfile:
    name: str
    params: int  # published parameter count
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int = 2
    gated_mlp: bool = True
    max_context: int = 4096
    tied_embeddings: bool = False

    # -- derived sizes ---------------------------------------------------------
    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers (whole model, before TP splitting)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        """Q, K, V and O projections."""
        return self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden

    @property
    def mlp_params_per_layer(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * self.intermediate

    @property
    def linear_params_per_layer(self) -> int:
        """Parameters of the GEMMs of one layer (each does 2 FLOPs per token)."""
        return self.attn_params_per_layer + self.mlp_params_per_layer

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def derived_params(self) -> int:
        """Parameter count implied by the shape (biases ignored), to check ``params``."""
        emb = self.vocab * self.hidden
        per_layer = self.linear_params_per_layer + 2 * self.hidden
        return emb * (1 if self.tied_embeddings else 2) + self.layers * per_layer + self.hidden

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads held by each GPU; vLLM replicates KV heads when tp > kv_heads."""
        return max(1, self.kv_heads // tp)

    def kv_bytes_per_token_per_gpu(self, tp: int) -> int:
        return 2 * self.layers * self.kv_heads_per_gpu(tp) * self.head_dim * self.dtype_bytes

    def weight_bytes_per_gpu(self, tp: int) -> float:
        return self.weight_bytes / tp


_PROFILES = (
    ModelProfile("Llama-3.1-8B", 8_030_261_248, 32, 4096, 32, 8, 128, 14336, 128256, max_context=131072),
    ModelProfile("Llama-3.1-70B", 70_553_706_496, 80, 8192, 64, 8, 128, 28672, 128256, max_context=131072),
    ModelProfile("Qwen2.5-7B", 7_615_616_512, 28, 3584, 28, 4, 128, 18944, 152064, max_context=32768),
    ModelProfile(
        "Gemma-3-270M", 268_098_176, 18, 640, 4, 1, 256, 2048, 262144, max_context=32768, tied_embeddings=True
    ),
    ModelProfile("Llama-2-7B", 6_738_415_616, 32, 4096, 32, 32, 128, 11008, 32000, max_context=4096),
)

#: Known models by canonical name.
MODELS: Mapping[str, ModelProfile] = MappingProxyType({m.name: m for m in _PROFILES})

_ALIASES = {
    "llama-3.1-8b": "Llama-3.1-8B", "llama-3.1-8b-instruct": "Llama-3.1-8B", "llama3.1-8b": "Llama-3.1-8B",
    "meta-llama-3.1-8b": "Llama-3.1-8B", "meta-llama-3.1-8b-instruct": "Llama-3.1-8B", "llama-3-8b": "Llama-3.1-8B",
    "llama-3.1-70b": "Llama-3.1-70B", "llama-3.1-70b-instruct": "Llama-3.1-70B", "llama3.1-70b": "Llama-3.1-70B",
    "meta-llama-3.1-70b": "Llama-3.1-70B", "meta-llama-3.1-70b-instruct": "Llama-3.1-70B",
    "llama-3.3-70b-instruct": "Llama-3.1-70B",
    "qwen2.5-7b": "Qwen2.5-7B", "qwen2.5-7b-instruct": "Qwen2.5-7B", "qwen-2.5-7b": "Qwen2.5-7B",
    "gemma-3-270m": "Gemma-3-270M", "gemma-3-270m-it": "Gemma-3-270M", "gemma3-270m": "Gemma-3-270M",
    "gemma-3-270m-q4-k-m": "Gemma-3-270M",
    "llama-2-7b": "Llama-2-7B", "llama-2-7b-hf": "Llama-2-7B", "llama-2-7b-chat-hf": "Llama-2-7B",
    "llama2-7b": "Llama-2-7B",
}


def _key(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    return key.rsplit("/", 1)[-1]  # drop the Hugging Face org ("meta-llama/", "Qwen/", "google/")


def model_profile(name: str) -> ModelProfile:
    """The profile of model ``name`` (case-insensitive; HF ids and short aliases)."""
    key = _key(name)
    canonical = _ALIASES.get(key) or next((n for n in MODELS if n.lower() == key), None)
    if canonical is None:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[canonical]
