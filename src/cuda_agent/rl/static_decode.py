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
the recipe's held-out evaluations of long turns take 14 minutes (docs/training.md, fortieth session). A step
attends only the cache's first slots that hold every row's tokens so far, in steps of `BUCKET` slots (a graph for
each such length, captured when the batch first reaches it): a reply that fills a quarter of its cache reads a
quarter of it. The cache is laid out block-major (block, row, head, slot in block, dim), so the first blocks are one
contiguous piece the block products read in place (row-major, a prefix of each row's cache is not: the products
copied it first, which made a half-filled cache's step slower than the whole cache's, measured on the H100).
q, k and v are one matrix product, the MLP's gate and up another, the norms torch's fused `rms_norm`.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

SPLIT = 256  # cache slots a block of the split attention; the cache's length is a multiple of it
BUCKET = 1024  # a step attends the smallest multiple of this many slots that holds every slot in use (one graph each)


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
    def __init__(self, model: torch.nn.Module, weights: dict[str, torch.Tensor], batch: int, length: int,
                 bucket: int = BUCKET):
        """Buffers for `batch` rows of up to `length` tokens (prompt and reply) in the model's dtype; a step attends
        the cache in lengths of `bucket` slots (rounded up to SPLIT's multiple; `length`: always the whole cache)."""
        c = model.config
        self.layers, self.heads, self.kv_heads = c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        self.w = {k.removeprefix("model."): v for k, v in weights.items()}
        for i in range(self.layers):  # (copies: a few hundred MB for SmolLM2-135M in fp32, while the batch decodes)
            p = f"layers.{i}."
            self.w[p + "qkv"] = torch.cat([self.w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
            self.w[p + "gate_up"] = torch.cat([self.w[p + "mlp.gate_proj.weight"], self.w[p + "mlp.up_proj.weight"]])
        self.lm_head = self.w.get("lm_head.weight", self.w["embed_tokens.weight"])
        self.inv_freq = model.model.rotary_emb.inv_freq.float()
        self.scaling = float(getattr(model.model.rotary_emb, "attention_scaling", 1.0))
        device, dtype = self.lm_head.device, self.lm_head.dtype
        length = -(-length // SPLIT) * SPLIT
        self.length, self.bucket = length, -(-bucket // SPLIT) * SPLIT
        shape = (self.layers, length // SPLIT, batch, self.kv_heads, SPLIT, self.head_dim)  # (block-major)
        self.k, self.v = torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype)
        # a slot's row in a layer's cache seen as (-1, dim), for each (row, head): block * this + these + offset
        self.rows = torch.arange(batch * self.kv_heads, device=device) * SPLIT
        self.used = torch.zeros(batch, length, dtype=torch.bool, device=device)  # slots a row attends to
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.next = 0  # the slot the next step writes (the host's copy of `slot`)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # attended length -> graph, logits
        self.pool = None  # the graphs' memory, shared (replayed one at a time, in the order captured)

    def load_prefill(self, past, attention: torch.Tensor, position: torch.Tensor) -> None:
        """The prompt's keys and values (its left-padded width of slots) and mask; the next step writes after it."""
        width = attention.shape[1]
        for i, (keys, values) in enumerate(prefill_cache(past)):
            for block, start in enumerate(range(0, width, SPLIT)):
                n = min(SPLIT, width - start)
                self.k[i, block, :, :, :n].copy_(keys[:, :, start:start + n])
                self.v[i, block, :, :, :n].copy_(values[:, :, start:start + n])
        self.used.zero_()
        self.used[:, :width].copy_(attention.bool())
        self.slot.fill_(width)
        self.next = width
        self.position.copy_(position[:, -1:] + 1)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), weight.shape, weight.float(), self.eps).to(x.dtype)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + turned * sin

    def _step(self, length: int) -> torch.Tensor:
        """One token per row at `position`, its keys and values written at `slot` (then both move on), attending the
        cache's first `length` slots: the next token's logits (float)."""
        w, b, heads, kv = self.w, self.token.shape[0], self.heads, self.kv_heads
        angles = self.position.float()[:, :, None] * self.inv_freq[None, None, :]  # (b, 1, half)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = (angles.cos() * self.scaling)[:, None], (angles.sin() * self.scaling)[:, None]  # (b, 1, 1, d)
        self.used.index_fill_(1, self.slot, True)
        blocks = length // SPLIT
        hidden = ~self.used[:, :length].view(b, blocks, SPLIT).transpose(0, 1)[:, :, None, None]  # not attended
        written = self.slot // SPLIT * (b * kv * SPLIT) + self.rows + self.slot % SPLIT  # (b * kv,)
        x = F.embedding(self.token, w["embed_tokens.weight"])  # (b, 1, hidden)
        for i in range(self.layers):
            p = f"layers.{i}."
            h = self._norm(x, w[p + "input_layernorm.weight"])
            qkv = F.linear(h, w[p + "qkv"]).view(b, 1, heads + 2 * kv, self.head_dim).transpose(1, 2)
            qk = self._rotate(qkv[:, :heads + kv], cos, sin).to(x.dtype)  # (b, heads + kv, 1, d)
            self.k[i].view(-1, self.head_dim).index_copy_(0, written, qk[:, heads:].reshape(b * kv, -1))
            self.v[i].view(-1, self.head_dim).index_copy_(0, written, qkv[:, heads + kv:].reshape(b * kv, -1))
            attended = self._attend(qk[:, :heads], self.k[i][:blocks], self.v[i][:blocks], hidden)
            x = x + F.linear(attended.reshape(b, 1, -1), w[p + "self_attn.o_proj.weight"])
            gate, up = F.linear(self._norm(x, w[p + "post_attention_layernorm.weight"]), w[p + "gate_up"]).chunk(2, -1)
            x = x + F.linear(F.silu(gate) * up, w[p + "mlp.down_proj.weight"])
        logits = F.linear(self._norm(x, w["norm.weight"]), self.lm_head)[:, -1].float()
        self.slot += 1
        self.position += 1
        return logits

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """One token's attention over the cache's first blocks (k, v: (blocks, b, kv, SPLIT, d)), block by block: the
        query heads that share a key-value head attend as that head's queries (one token: no causality); the softmax
        is over every block at once."""
        blocks, b, g = k.shape[0], q.shape[0], self.heads // self.kv_heads
        grouped = q.reshape(b, self.kv_heads, g, self.head_dim)
        scores = (grouped @ k.transpose(-1, -2)).float() * self.head_dim ** -0.5  # (blocks, b, kv, g, SPLIT)
        scores = scores.masked_fill(hidden, float("-inf"))
        weights = torch.softmax(scores.permute(1, 2, 3, 0, 4).reshape(b, self.kv_heads, g, -1), dim=-1)
        weights = weights.view(b, self.kv_heads, g, blocks, SPLIT).permute(3, 0, 1, 2, 4).to(v.dtype)
        return (weights @ v).sum(0, dtype=torch.float32).to(v.dtype)  # (b, kv, g, head_dim): blocks summed in fp32

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed `token` (b, 1): the logits of the token after it. On CUDA each attended length's step is captured as
        a graph when first needed (after one eager warm-up on a side stream, whose writes are undone) and replayed
        after."""
        self.token.copy_(token)
        length = min(-(-(self.next + 1) // self.bucket) * self.bucket, self.length)
        self.next += 1
        if self.token.device.type != "cuda":
            return self._step(length)
        if length not in self.graphs:
            self.graphs[length] = self._capture(length)
        graph, logits = self.graphs[length]
        graph.replay()
        return logits

    def _capture(self, length: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        saved = (self.slot.clone(), self.position.clone(), self.used.clone())
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._step(length)  # warm-up: kernels chosen, workspaces allocated, outside the graph
        torch.cuda.current_stream().wait_stream(stream)
        self.slot.copy_(saved[0]), self.position.copy_(saved[1]), self.used.copy_(saved[2])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):  # episode threads go on
            logits = self._step(length)
        self.pool = self.pool or graph.pool()
        # capture recorded the step without running it: the state is where it was
        return graph, logits
