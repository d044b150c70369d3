"""LoRA for the actor (`TrainConfig.lora_rank`): low-rank updates of the model's linear layers, small enough to carry
back from a machine that trained them (a SmolLM2-135M adapter of rank 8 on the attention and MLP projections is
about 10 MB; the model is 540 MB).

The updates ride on forward hooks, so the model's own modules and state dict stay as they are: each target layer's
output gets `alpha / rank * B(A(x))`, B starting at zero (a fresh adapter changes nothing) and the base weights
frozen. A checkpoint holds the merged model (what the next stage and the evaluations read as a plain HF folder) and
`adapter/` in PEFT's file layout (`adapter_config.json`, `adapter_model.safetensors`, the tokenizer) whose
`base_model_name_or_path` names the model it was trained on; when that model was itself an adapter's merge, its
`adapter/` is named too (`parent_adapter`, relative, so a run folder carried elsewhere keeps its chain), and
`merged_model(ADAPTER)` (what `Actor.load` does with an adapter folder) rebuilds the chain from the root model.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CONFIG, WEIGHTS, PREFIX = "adapter_config.json", "adapter_model.safetensors", "base_model.model."


class LoRA(nn.Module):
    def __init__(self, model: nn.Module, rank: int, alpha: float, targets: tuple[str, ...] = TARGETS):
        super().__init__()
        self.rank, self.alpha, self.scale, self.targets = rank, alpha, alpha / rank, tuple(targets)
        self.names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1]
                      in self.targets]
        if rank < 1 or not self.names:
            raise ValueError(f"LoRA needs rank >= 1 and linear layers named {', '.join(targets)} in the model")
        self.A, self.B = nn.ParameterDict(), nn.ParameterDict()
        for name in self.names:
            layer = model.get_submodule(name)
            a = torch.empty(rank, layer.in_features, device=layer.weight.device)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
            self.A[self._key(name)] = nn.Parameter(a)
            self.B[self._key(name)] = nn.Parameter(torch.zeros(layer.out_features, rank, device=layer.weight.device))
        model.requires_grad_(False)
        self.model, self._handles = [model], []  # (a list: not a submodule of the adapter)
        self.attach()

    @staticmethod
    def _key(name: str) -> str:
        return name.replace(".", "__")

    def attach(self) -> None:
        for name in self.names:
            key = self._key(name)
            hook = lambda layer, args, out, key=key: out + self.scale * F.linear(  # noqa: E731
                F.linear(args[0], self.A[key].to(args[0].dtype)), self.B[key].to(args[0].dtype))
            self._handles.append(self.model[0].get_submodule(name).register_forward_hook(hook))

    def detach(self) -> None:
        """The model without its updates (e.g. to copy it as the KL reference); `attach` puts them back."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's state dict with every update added into its weight."""
        state = dict(self.model[0].state_dict())
        with torch.no_grad():
            for name in self.names:
                key = self._key(name)
                state[f"{name}.weight"] = state[f"{name}.weight"] + self.scale * (self.B[key] @ self.A[key]).to(
                    state[f"{name}.weight"].dtype)
        return state

    def save(self, folder: Path, base: Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for name in self.names:
            key = self._key(name)
            tensors[f"{PREFIX}{name}.lora_A.weight"] = self.A[key].detach().float().cpu().contiguous()
            tensors[f"{PREFIX}{name}.lora_B.weight"] = self.B[key].detach().float().cpu().contiguous()
        save_file(tensors, str(folder / WEIGHTS))
        parent = Path(base).resolve() / "adapter"  # (through the `checkpoint` link to the step folder)
        (folder / CONFIG).write_text(json.dumps({
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank, "lora_alpha": self.alpha,
            "target_modules": list(self.targets), "lora_dropout": 0.0, "bias": "none",
            "base_model_name_or_path": str(Path(base).resolve()),  # relative: the run folder travels whole
            "parent_adapter": os.path.relpath(parent, folder.resolve()) if is_adapter(parent) else None}, indent=2))

    @classmethod
    def load(cls, model: nn.Module, folder: Path) -> LoRA:
        """An adapter saved by `save`, attached to `model` (the model it was trained on)."""
        from safetensors.torch import load_file

        config = json.loads((Path(folder) / CONFIG).read_text())
        lora = cls(model, config["r"], config["lora_alpha"], tuple(config["target_modules"]))
        tensors = load_file(str(Path(folder) / WEIGHTS))
        with torch.no_grad():
            for name in lora.names:
                lora.A[cls._key(name)].copy_(tensors[f"{PREFIX}{name}.lora_A.weight"])
                lora.B[cls._key(name)].copy_(tensors[f"{PREFIX}{name}.lora_B.weight"])
        return lora


def is_adapter(folder: Path) -> bool:
    return (Path(folder) / CONFIG).is_file()


def merged_model(folder: Path, root: Path | None = None, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The model an adapter's training ended with, rebuilt on the CPU: its parent adapters' merges first, from the
    root model (`root` when given: the adapter names the folder it had where it was trained)."""
    from transformers import AutoModelForCausalLM

    config = json.loads((Path(folder) / CONFIG).read_text())
    if config.get("parent_adapter"):
        model = merged_model(Path(folder) / config["parent_adapter"], root, dtype)
    else:
        base = Path(root or config["base_model_name_or_path"])
        if not (base / "config.json").is_file():
            raise FileNotFoundError(f"{folder}: its base model {base} is not here (give the root model's folder)")
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    return merge(model, folder)


def merge(model: nn.Module, folder: Path) -> nn.Module:
    """`model` (the one the adapter in `folder` was trained on) with the adapter's updates added into its weights."""
    lora = LoRA.load(model, folder)
    model.load_state_dict(lora.merged_state_dict())
    lora.detach()
    model.requires_grad_(True)
    return model
