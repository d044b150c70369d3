"""The static decoder's step at the recipe's cache lengths, side by side in one run: its attention split over the
cache (static_decode.SPLIT slots a block, now) against one fused attention call over the whole cache with a mask
(before), each as a CUDA-graph replay of the whole step on a model of SmolLM2-135M's config. Per batch and cache
length: ms a step, tokens/s, the ratio, and the largest difference of the two steps' logits.

    python3 benchmarks/decode_attention.py [--batches 32,64] [--lengths 1024,4096,8192] [--steps 64] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cuda_agent.rl.static_decode import StaticDecoder  # noqa: E402
from rollout_speed import SMOLLM2_135M  # noqa: E402


def fused(self, q, k, v, hidden, blocks):
    """The step's attention before: one SDPA call over the whole cache, the slots in use as its mask."""
    grouped = q.reshape(q.shape[0], self.kv_heads, self.heads // self.kv_heads, self.head_dim)
    mask = ~hidden.reshape(q.shape[0], 1, 1, -1)
    return F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask)


def timed(model, batch: int, length: int, steps: int, attention) -> tuple[float, torch.Tensor]:
    """ms a step of a decoder whose cache is filled to `length - steps` slots, and the first step's logits."""
    decoder = StaticDecoder(model, dict(model.state_dict()), batch, length)
    if attention is not None:
        decoder._attend = attention.__get__(decoder)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for cache in (decoder.k, decoder.v):
        cache.normal_(generator=gen)
    decoder.used[:, :length - steps] = True
    decoder.slot.fill_(length - steps)
    decoder.position.fill_(length - steps)
    token = torch.randint(1, 49152, (batch, 1), device="cuda", generator=gen)
    first = decoder.step(token).clone()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(steps - 1):
        decoder.step(token)
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / (steps - 1) * 1e3, first


def main() -> None:
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="32,64")
    parser.add_argument("--lengths", default="1024,4096,8192")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMOLLM2_135M)).cuda().eval()
    rows = []
    with torch.no_grad():
        for batch in map(int, args.batches.split(",")):
            for length in map(int, args.lengths.split(",")):
                split_ms, split_logits = timed(model, batch, length, args.steps, None)
                fused_ms, fused_logits = timed(model, batch, length, args.steps, fused)
                row = {"batch": batch, "cache": length, "split_ms": round(split_ms, 2), "fused_ms": round(fused_ms, 2),
                       "split_tokens_per_s": round(batch * 1e3 / split_ms), "speedup": round(fused_ms / split_ms, 2),
                       "max_logit_diff": (split_logits - fused_logits).abs().max().item()}
                rows.append(row)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
