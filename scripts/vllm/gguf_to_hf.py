"""GGUF -> Hugging Face safetensors directory (fp32), for vLLM: gguf_to_hf.py GGUF_DIR GGUF_FILE OUT_DIR."""
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
d, f, out = sys.argv[1], sys.argv[2], sys.argv[3]
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
for k in ("is_quantized", "quantization_method"):
    if hasattr(model, k):
        try: setattr(model, k, False if k == "is_quantized" else None)
        except Exception: pass
model.save_pretrained(out); tok.save_pretrained(out)
print("saved", out)
