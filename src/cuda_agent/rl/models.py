"""The actor (a causal LM) and the critic (the same backbone with a value head) of PPO, on any HF checkpoint.

Rollouts sample from the actor's model through the batcher (batcher.py), which returns the log-probs of what it
sampled; training recomputes them on the same ids at the same temperature, so the rollout's and the trainer's
numbers agree.
"""

from __future__ import annotations

from copy import deepcopy
from pathlib import Path

import torch
from torch.nn import functional as F

from .algorithm import entropy, token_logprobs
from .lora import LoRA, is_adapter, merged_model


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on each row's first real token (rows are left-padded): without them a padded
    row's positions are shifted, exact only for a model whose positions are purely relative."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class _FusedRMSNorm:
    """An HF RMSNorm (`weight`, `variance_epsilon`) whose forward under autocast (the bf16 trainer) is torch's
    `rms_norm`, on CUDA one fused kernel each way in place of five elementwise ones over the fp32 residual stream;
    without autocast (fp32, the sampler) the model's own forward, bit for bit."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        kind = hidden.device.type
        if not torch.is_autocast_enabled(kind):
            return super().forward(hidden)
        out = torch.promote_types(hidden.dtype, self.weight.dtype)  # as the model's own: weight * normed
        with torch.autocast(kind, enabled=False):
            return F.rms_norm(hidden.float(), self.weight.shape, self.weight.float(), self.variance_epsilon).to(out)


_FUSED: dict[type, type] = {}


def fuse_norms(model: torch.nn.Module) -> torch.nn.Module:
    """Give every RMSNorm of `model` the fused forward under CUDA autocast (its class swapped for a subclass: the
    state dict, hooks, copies and `save_pretrained` stay as they were). Returns `model`."""
    for module in model.modules():
        kind = type(module)
        if kind.__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon") and kind not in _FUSED.values():
            if kind not in _FUSED:
                _FUSED[kind] = type(f"Fused{kind.__name__}", (_FusedRMSNorm, kind), {})
            module.__class__ = _FUSED[kind]
    return model


def last_hidden(decoder: torch.nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states of a batch whose rows hold their tokens in one block (left- and right-padded,
    as `rollout.batch_of` pads them). Where it is fast, without a mask: each row is rolled so its tokens start at
    column 0 (its padding then follows them, and a causal model never looks ahead), run with no mask (SDPA's flash
    kernel under bf16, with GQA native; with a mask SDPA takes a slower kernel and transformers repeats the keys),
    and rolled back; the states at padding positions are then meaningless, as they are with a mask. With a mask:
    rows whose tokens are not one block, and fp32 on CUDA (there SDPA's only GQA kernel without a mask is the math
    one, whose memory grows with the length squared)."""
    left = (attention_mask.long().cumsum(-1) == 0).sum(-1)  # each row's padding before its first token
    columns = torch.arange(ids.shape[1], device=ids.device)
    shift = (columns + left[:, None]) % ids.shape[1]
    rolled = attention_mask.gather(1, shift)
    one_block = bool((rolled[:, :-1] >= rolled[:, 1:]).all())
    if not one_block or (ids.device.type == "cuda" and not torch.is_autocast_enabled("cuda")):
        return decoder(input_ids=ids, attention_mask=attention_mask, position_ids=positions(attention_mask),
                       use_cache=False).last_hidden_state
    hidden = decoder(input_ids=ids.gather(1, shift), use_cache=False).last_hidden_state
    back = (columns - left[:, None]) % ids.shape[1]
    return hidden.gather(1, back[..., None].expand(-1, -1, hidden.shape[-1]))


class Actor(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = fuse_norms(model)
        self.lora: LoRA | None = None

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32,
             root: Path | None = None) -> Actor:
        """An HF folder, or a LoRA adapter folder (the model its training ended with, rebuilt on `root` or the root
        model it names: lora.py)."""
        from transformers import AutoModelForCausalLM

        if is_adapter(Path(path)):
            return cls(merged_model(Path(path), root, dtype).to(device))
        return cls(AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device))

    def add_lora(self, rank: int, alpha: float, adapter: Path | None = None) -> None:
        """Train low-rank updates only (`adapter`: continue the one saved there, on the same base model)."""
        self.lora = LoRA.load(self.model, adapter) if adapter is not None else LoRA(self.model, rank, alpha)
        self.model.enable_input_require_grads()  # (gradient checkpointing then reaches the updates)

    def decoding_weights(self) -> dict[str, torch.Tensor]:
        """The weights the model computes with now (LoRA's updates merged in): what a static decoder reads."""
        return self.lora.merged_state_dict() if self.lora is not None else dict(self.model.state_dict())

    def frozen_copy(self) -> torch.nn.Module:
        """The policy as it is now, without anything that trains (the KL reference)."""
        if self.lora is not None:
            self.lora.detach()
        try:
            copy = deepcopy(self.model)
        finally:
            if self.lora is not None:
                self.lora.attach()
        if self.lora is not None:
            copy.load_state_dict(self.lora.merged_state_dict())
        return copy.eval().requires_grad_(False)

    def save(self, path: Path, base: Path | None = None) -> None:
        """An HF folder (with LoRA: the merged weights, and the adapter in `adapter/`, trained on `base`)."""
        if self.lora is None:
            self.model.save_pretrained(path)
            return
        self.model.save_pretrained(path, state_dict=self.lora.merged_state_dict())
        self.lora.save(Path(path) / "adapter", base)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def logprobs(self, ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0,
                 with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log p(ids[:, t] | ids[:, :t]) for t >= 1 (shape [batch, len - 1]), and the entropy at each position."""
        logits = self.model(input_ids=ids, attention_mask=attention_mask,
                            position_ids=positions(attention_mask)).logits[:, :-1] / temperature
        return token_logprobs(logits, ids[:, 1:]), entropy(logits) if with_entropy else None


class Critic(torch.nn.Module):
    """The backbone's last hidden state -> one value per token."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = fuse_norms(backbone)
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.lora: LoRA | None = None

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Critic:
        from transformers import AutoModel

        backbone = AutoModel.from_pretrained(path, dtype=dtype)
        critic = cls(backbone, backbone.config.hidden_size).to(device)
        head = Path(path) / "value_head.pt"
        if head.is_file():  # a critic saved by `save` (value pretraining's output)
            critic.head.load_state_dict(torch.load(head, map_location=device))
        return critic

    def add_lora(self, rank: int, alpha: float, adapter: Path | None = None) -> None:
        """Train the head and low-rank updates of the backbone only (`adapter`: continue the one saved there, on
        the same backbone): what it learns then travels without its weights (checkpoints.rebuild)."""
        self.lora = LoRA.load(self.backbone, adapter) if adapter is not None else LoRA(self.backbone, rank, alpha)
        self.backbone.enable_input_require_grads()  # (gradient checkpointing then reaches the updates)

    def save(self, path: str | Path, base: Path | None = None) -> None:
        """An HF folder of the backbone and `value_head.pt` (with LoRA: the merged weights, and the adapter in
        `adapter/`, trained on the critic at `base`)."""
        if self.lora is None:
            self.backbone.save_pretrained(path)
        else:
            self.backbone.save_pretrained(path, state_dict=self.lora.merged_state_dict())
            self.lora.save(Path(path) / "adapter", base)
        torch.save(self.head.state_dict(), Path(path) / "value_head.pt")

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """V(ids[:, :t+1]) for t < len - 1: the value before each next token (aligned with Actor.logprobs)."""
        hidden = last_hidden(self.backbone, ids, attention_mask)[:, :-1]
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)
