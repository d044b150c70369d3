"""The batch sampler's decode step for Llama-architecture models (SmolLM2's): static buffers, one CUDA graph.

A decode step of a small model through transformers is a few hundred kernel launches and Python between them
(~30 ms for SmolLM2-135M at any batch size), so the GPU idles. Here one step is written once over buffers that
never move (the KV cache of every layer at its full length, the token, each row's position, the slot the step
writes, the mask of slots in use), so on CUDA it is captured once per batch as a CUDA graph and each step is one
replay. The prompt's prefill still runs through the model itself (its keys and values are copied into the static
cache), and so do models this does not know (`supports` says why not): the batch sampler then keeps its plain loop.

The weights are read at `StaticDecoder` construction (`weights`: the model's state dict, or the merged one of a
LoRA actor), so a decoder serves one batch of one policy; the math is the model's (RMSNorm, rotary embedding of
the default type, grouped-query attention, SiLU-gated MLP), checked against it token by token in the tests.

Attention is split over the cache's length (`SPLIT` slots a block, one matrix product per block, then summed):
one query token per row gives a fused attention kernel only batch x heads blocks of work, each streaming the whole
cache alone, which on the H100 read a 12 GB cache (32 rows of 8,192 slots) at ~250 GB/s, 50 ms a step, and made
the recipe's held-out evaluations of long turns take 14 minutes (docs/training.md, fortieth session).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

SPLIT = 256  # cache slots a block of the split attention; the cache's length is a multiple of it


def supports(model: torch.nn.Module) -> str | None:
    """None when `model` can be decoded here, else why not."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in ("llama",):
        return f"model type {getattr(config, 'model_type', None)!r} (only llama)"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return f"rope type {rope.get('rope_type', rope.get('type'))!r} (only the default)"
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "attention_bias", False) or \
            getattr(config, "mlp_bias", False):
        return "an activation other than SiLU, or biases in attention or MLP"
    return None


def prefill_cache(past) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) of each layer from the model's cache after a prefill (transformers 4.x or 5.x)."""
    if hasattr(past, "layers"):
        return [(layer.keys, layer.values) for layer in past.layers]
    if hasattr(past, "key_cache"):
        return list(zip(past.key_cache, past.value_cache))
    return [(k, v) for k, v in past]


class StaticDecoder:
    def __init__(self, model: torch.nn.Module, weights: dict[str, torch.Tensor], batch: int, length: int):
        """Buffers for `batch` rows of up to `length` tokens (prompt and reply) in the model's dtype."""
        c = model.config
        self.layers, self.heads, self.kv_heads = c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        self.w = {k.removeprefix("model."): v for k, v in weights.items()}
        self.lm_head = self.w.get("lm_head.weight", self.w["embed_tokens.weight"])
        self.inv_freq = model.model.rotary_emb.inv_freq.float()
        self.scaling = float(getattr(model.model.rotary_emb, "attention_scaling", 1.0))
        device, dtype = self.lm_head.device, self.lm_head.dtype
        length = -(-length // SPLIT) * SPLIT
        shape = (self.layers, batch, self.kv_heads, length, self.head_dim)
        self.k, self.v = torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype)
        self.used = torch.zeros(batch, length, dtype=torch.bool, device=device)  # slots a row attends to
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.logits: torch.Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None

    def load_prefill(self, past, attention: torch.Tensor, position: torch.Tensor) -> None:
        """The prompt's keys and values (its left-padded width of slots) and mask; the next step writes after it."""
        width = attention.shape[1]
        for i, (keys, values) in enumerate(prefill_cache(past)):
            self.k[i, :, :, :width].copy_(keys)
            self.v[i, :, :, :width].copy_(values)
        self.used.zero_()
        self.used[:, :width].copy_(attention.bool())
        self.slot.fill_(width)
        self.position.copy_(position[:, -1:] + 1)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * y.to(x.dtype)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + turned * sin

    def _step(self) -> torch.Tensor:
        """One token per row at `position`, its keys and values written at `slot` (then both move on): the next
        token's logits (float)."""
        w, b = self.w, self.token.shape[0]
        angles = self.position.float()[:, :, None] * self.inv_freq[None, None, :]  # (b, 1, half)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = (angles.cos() * self.scaling)[:, None], (angles.sin() * self.scaling)[:, None]  # (b, 1, 1, d)
        self.used.index_fill_(1, self.slot, True)
        blocks = self.used.shape[1] // SPLIT
        hidden = ~self.used.view(b, 1, blocks, 1, SPLIT)  # slots a row does not attend to
        x = F.embedding(self.token, w["embed_tokens.weight"])  # (b, 1, hidden)
        for i in range(self.layers):
            p = f"layers.{i}."
            h = self._norm(x, w[p + "input_layernorm.weight"])
            q = F.linear(h, w[p + "self_attn.q_proj.weight"]).view(b, 1, self.heads, self.head_dim).transpose(1, 2)
            k = F.linear(h, w[p + "self_attn.k_proj.weight"]).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            v = F.linear(h, w[p + "self_attn.v_proj.weight"]).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = self._rotate(q, cos, sin).to(x.dtype), self._rotate(k, cos, sin).to(x.dtype)
            self.k[i].index_copy_(2, self.slot, k)
            self.v[i].index_copy_(2, self.slot, v)
            attended = self._attend(q, self.k[i], self.v[i], hidden, blocks)
            x = x + F.linear(attended.reshape(b, 1, -1), w[p + "self_attn.o_proj.weight"])
            h = self._norm(x, w[p + "post_attention_layernorm.weight"])
            gated = F.silu(F.linear(h, w[p + "mlp.gate_proj.weight"])) * F.linear(h, w[p + "mlp.up_proj.weight"])
            x = x + F.linear(gated, w[p + "mlp.down_proj.weight"])
        logits = F.linear(self._norm(x, w["norm.weight"]), self.lm_head)[:, -1].float()
        self.slot += 1
        self.position += 1
        return logits

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor,
                blocks: int) -> torch.Tensor:
        """One token's attention over the cache, block by block: the query heads that share a key-value head
        attend as that head's queries (one token: no causality); the softmax is over every block at once."""
        b, g = q.shape[0], self.heads // self.kv_heads
        grouped = q.reshape(b, self.kv_heads, 1, g, self.head_dim)
        k = k.view(b, self.kv_heads, blocks, SPLIT, self.head_dim)
        v = v.view(b, self.kv_heads, blocks, SPLIT, self.head_dim)
        scores = (grouped @ k.transpose(-1, -2)).float() * self.head_dim ** -0.5  # (b, kv, blocks, g, SPLIT)
        scores = scores.masked_fill(hidden, float("-inf"))
        weights = torch.softmax(scores.transpose(2, 3).reshape(b, self.kv_heads, g, -1), dim=-1)
        weights = weights.view(b, self.kv_heads, g, blocks, SPLIT).transpose(2, 3).to(v.dtype)
        return (weights @ v).sum(2, dtype=torch.float32).to(v.dtype)  # (b, kv, g, head_dim): blocks summed in fp32

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed `token` (b, 1): the logits of the token after it. On CUDA the step is captured as a graph at its
        first call (after one eager warm-up on a side stream, whose writes are undone) and replayed after."""
        self.token.copy_(token)
        if self.token.device.type != "cuda":
            return self._step()
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.logits

    def _capture(self) -> None:
        saved = (self.slot.clone(), self.position.clone(), self.used.clone())
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._step()  # warm-up: kernels chosen, workspaces allocated, outside the graph
        torch.cuda.current_stream().wait_stream(stream)
        self.slot.copy_(saved[0]), self.position.copy_(saved[1]), self.used.copy_(saved[2])
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):  # episode threads go on meanwhile
            self.logits = self._step()
        # capture recorded the step without running it: the state is where it was
