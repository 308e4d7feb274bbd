"""Random-weight Llama-3.1-8B-shaped checkpoint (BF16 safetensors) + a small real tokenizer."""
import contextlib
import shutil
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

out, tok = sys.argv[1], sys.argv[2]
t = time.perf_counter()
cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
torch.manual_seed(0)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.config.architectures = ["LlamaForCausalLM"]
model.save_pretrained(out)
for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
    with contextlib.suppress(FileNotFoundError):
        shutil.copy(f"{tok}/{f}", f"{out}/{f}")
print(f"built and saved in {time.perf_counter() - t:.1f} s")
