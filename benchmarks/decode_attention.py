"""The static decoder's step at the recipe's cache lengths, side by side in one run, as CUDA-graph replays on a model
of SmolLM2-135M's config: now (the slots in use attended in buckets of static_decode.BUCKET from a block-major
cache; q/k/v and gate/up one matrix product each; fused norms), the same over the whole cache (bucket = the cache:
what the step read before the buckets), and the step before (three projections and two for the MLP, five-kernel
norms, a row-major cache, the whole of it). Per batch, cache length and slots filled: ms a step, tokens/s, the
ratios, and the largest difference of the first step's logits from the step before.

    python3 benchmarks/decode_attention.py [--batches 16,32] [--cache 8192] [--fills 1024,2048,4096,8000]
        [--steps 64] [--out FILE]
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

from cuda_agent.rl.static_decode import BUCKET, SPLIT, StaticDecoder  # noqa: E402
from rollout_speed import SMOLLM2_135M  # noqa: E402


def old_attend(self, q, k, v, hidden, blocks: int) -> torch.Tensor:
    """The attention before the change, over a row-major cache (b, kv, length, d)."""
    b, g = q.shape[0], self.heads // self.kv_heads
    grouped = q.reshape(b, self.kv_heads, 1, g, self.head_dim)
    k = k.view(b, self.kv_heads, blocks, SPLIT, self.head_dim)
    v = v.view(b, self.kv_heads, blocks, SPLIT, self.head_dim)
    scores = (grouped @ k.transpose(-1, -2)).float() * self.head_dim ** -0.5
    scores = scores.masked_fill(hidden, float("-inf"))
    weights = torch.softmax(scores.transpose(2, 3).reshape(b, self.kv_heads, g, -1), dim=-1)
    weights = weights.view(b, self.kv_heads, g, blocks, SPLIT).transpose(2, 3).to(v.dtype)
    return (weights @ v).sum(2, dtype=torch.float32).to(v.dtype)


def before(self, length: int) -> torch.Tensor:
    """The step before the change: each projection its own matrix product, the norms in five kernels, a row-major
    cache (`k_old`, `v_old`)."""
    def norm(x, weight):
        y = x.float()
        return weight * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    w, b = self.w, self.token.shape[0]
    angles = self.position.float()[:, :, None] * self.inv_freq[None, None, :]
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = (angles.cos() * self.scaling)[:, None], (angles.sin() * self.scaling)[:, None]
    self.used.index_fill_(1, self.slot, True)
    blocks = length // SPLIT
    hidden = ~self.used[:, :length].reshape(b, 1, blocks, 1, SPLIT)
    x = F.embedding(self.token, w["embed_tokens.weight"])
    for i in range(self.layers):
        p = f"layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = F.linear(h, w[p + "self_attn.q_proj.weight"]).view(b, 1, self.heads, self.head_dim).transpose(1, 2)
        k = F.linear(h, w[p + "self_attn.k_proj.weight"]).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
        v = F.linear(h, w[p + "self_attn.v_proj.weight"]).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self._rotate(q, cos, sin).to(x.dtype), self._rotate(k, cos, sin).to(x.dtype)
        self.k_old[i].index_copy_(2, self.slot, k)
        self.v_old[i].index_copy_(2, self.slot, v)
        attended = old_attend(self, q, self.k_old[i][:, :, :length], self.v_old[i][:, :, :length], hidden, blocks)
        x = x + F.linear(attended.reshape(b, 1, -1), w[p + "self_attn.o_proj.weight"])
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        gated = F.silu(F.linear(h, w[p + "mlp.gate_proj.weight"])) * F.linear(h, w[p + "mlp.up_proj.weight"])
        x = x + F.linear(gated, w[p + "mlp.down_proj.weight"])
    logits = F.linear(norm(x, w["norm.weight"]), self.lm_head)[:, -1].float()
    self.slot += 1
    self.position += 1
    return logits


def timed(model, batch: int, cache: int, filled: int, steps: int, bucket: int, step=None) -> tuple[float, torch.Tensor]:
    """ms a step of a decoder of `cache` slots filled to `filled` (random keys and values), and its first logits."""
    decoder = StaticDecoder(model, dict(model.state_dict()), batch, cache, bucket)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for kv in (decoder.k, decoder.v):
        kv.normal_(generator=gen)
    if step is not None:  # (the same cache, row-major)
        decoder._step = step.__get__(decoder)
        decoder.k_old, decoder.v_old = (kv.permute(0, 2, 3, 1, 4, 5).reshape(
            decoder.layers, batch, decoder.kv_heads, decoder.length, decoder.head_dim) for kv in (decoder.k, decoder.v))
    decoder.used[:, :filled] = True
    decoder.slot.fill_(filled)
    decoder.position.fill_(filled)
    decoder.next = filled
    token = torch.randint(1, SMOLLM2_135M["vocab_size"], (batch, 1), device="cuda", generator=gen)
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
    parser.add_argument("--batches", default="16,32")
    parser.add_argument("--cache", type=int, default=8192, help="slots of each decoder's cache")
    parser.add_argument("--fills", default="1024,2048,4096,8000", help="slots in use when the timed steps begin")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMOLLM2_135M)).cuda().eval()
    rows = []
    with torch.no_grad():
        for batch in map(int, args.batches.split(",")):
            for filled in map(int, args.fills.split(",")):
                if filled + args.steps > args.cache:
                    raise SystemExit(f"--fills {filled} + --steps {args.steps} do not fit a cache of {args.cache}")
                now_ms, now = timed(model, batch, args.cache, filled, args.steps, BUCKET)
                whole_ms, _ = timed(model, batch, args.cache, filled, args.steps, args.cache)
                before_ms, old = timed(model, batch, args.cache, filled, args.steps, args.cache, before)
                row = {"batch": batch, "cache": args.cache, "filled": filled, "now_ms": round(now_ms, 2),
                       "whole_cache_ms": round(whole_ms, 2), "before_ms": round(before_ms, 2),
                       "now_tokens_per_s": round(batch * 1e3 / now_ms), "speedup": round(before_ms / now_ms, 2),
                       "max_logit_diff": (now - old).abs().max().item()}
                rows.append(row)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
