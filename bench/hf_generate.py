#!/usr/bin/env python3
"""hf_generate.py — the same-run anchor of bench/cuda/bench_decode_cuda.cu: Hugging Face transformers `generate` of
Kimi-Linear on the same config with random weights (greedy, KV/recurrent cache on), decode tokens/s at the same batches.
Decode time = time(prompt + N new tokens) − time(prompt + 1 new token). fla's kernels are used when importable
(FLA_PATH, as ../shared/bench/side_device.py); whether they were is printed, since transformers otherwise falls back to
its torch reference. Usage: python3 bench/hf_generate.py CONFIG.json [prompt] [new] [batches] [dtype]."""
import json, os, sys, time

sys.path.insert(0, os.environ.get("FLA_PATH", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "anchors")))
import torch

try:
    import fla.ops.kda  # noqa: F401  (imported first: transformers then takes fla's kernels)
except Exception as e:  # the anchor still runs, on transformers' torch path, and says so
    print("fla not importable:", repr(e)[:200])
from transformers.models.kimi_linear.configuration_kimi_linear import KimiLinearConfig
from transformers.models.kimi_linear import modeling_kimi_linear as mk

cfg_path = sys.argv[1]
P = int(sys.argv[2]) if len(sys.argv) > 2 else 64
N = int(sys.argv[3]) if len(sys.argv) > 3 else 64
batches = [int(b) for b in (sys.argv[4] if len(sys.argv) > 4 else "1,64,256").split(",")]
dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[sys.argv[5] if len(sys.argv) > 5 else "bf16"]
d = json.load(open(cfg_path))
cfg = KimiLinearConfig(**{k: v for k, v in d.items() if k not in ("architectures", "transformers_version")})
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
m = mk.KimiLinearForCausalLM(cfg).to(device="cuda", dtype=dtype).eval()
print(f"transformers generate, {cfg_path}, {dtype}, prompt {P}, {N} new tokens, fla loaded: {'fla.ops.kda' in sys.modules}")


def gen(ids, n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


print(f"{'batch':<8} {'ms/step':>10} {'tokens/s':>12}")
for B in batches:
    try:
        ids = torch.randint(3, cfg.vocab_size, (B, P), device="cuda")
        gen(ids, 2)  # warm-up
        dt = min(gen(ids, N) for _ in range(2)) - min(gen(ids, 1) for _ in range(2))
        print(f"{B:<8} {dt / (N - 1) * 1e3:>10.3f} {B * (N - 1) / dt:>12.0f}", flush=True)
    except Exception as e:
        print(f"{B:<8} error {repr(e)[:300]}", flush=True)
