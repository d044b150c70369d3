"""Seed operators from `transformers`: activations, and the norms, rotary embeddings, MLP and attention blocks of
common architectures. Each becomes a standalone task (the paper keeps transformers operators unfused).

The crawl imports each architecture's modeling module, picks its classes by role (the class name's suffix), binds
the constructor's parameters by name (`config`, `layer_idx`, `hidden_size`...) to a small configuration of that
architecture (`AutoConfig.for_model`), and builds and runs the task on the CPU at tiny sizes. What cannot be
built or run is recorded with the reason. A task imports its block from `transformers`, so evaluating it needs
`transformers` installed where the judge runs.
"""

from __future__ import annotations

import importlib
import inspect
import json
import warnings
from dataclasses import dataclass

from .taskfile import load, with_batch

ARCHITECTURES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo", "starcoder2",
                 "gpt_neox", "falcon", "gpt2", "bert", "t5")
ROLES = {"norm": ("RMSNorm", "LayerNorm"), "mlp": ("MLP", "Intermediate"), "attention": ("Attention",),
         "rotary": ("RotaryEmbedding",)}
NOT_ACTIVATIONS = {"linear": "identity"}
# Task sizes (a 1B-class layer) and the tiny ones the crawl runs at; head_dim = hidden / heads everywhere.
SIZES = {"hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 4,
         "head_dim": 64, "seq": 512}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "seq": 8}
ARCH_EXTRA = {  # the same sizes under the names some configurations use
    "t5": lambda s: {"d_ff": s["intermediate_size"], "d_kv": s["head_dim"]},
    "gpt2": lambda s: {"n_inner": s["intermediate_size"]},
    "gpt_neox": lambda s: {"rotary_pct": 1.0},
}
ARCH_DERIVED = {"falcon": ("head_dim",)}  # read-only properties of these configurations
BY_NAME = {"hidden_size": "hidden_size", "dim": "hidden_size", "d_model": "hidden_size", "embed_dim": "hidden_size",
           "intermediate_size": "intermediate_size"}


@dataclass(frozen=True)
class HFOp:
    """One transformers operator and the task source that runs it standalone."""
    name: str  # "transformers:LlamaMLP" or "transformers:act:gelu_new"
    role: str
    source: str


def crawl_transformers() -> tuple[list[HFOp], list[dict]]:
    """(usable operators, rejected ones with the reason); raises ImportError without transformers."""
    import transformers

    transformers.logging.set_verbosity_error()
    ops: list[HFOp] = []
    rejected: list[dict] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, source in _activation_sources():
            if name in NOT_ACTIVATIONS:
                rejected.append({"name": f"transformers:act:{name}", "reason": NOT_ACTIVATIONS[name]})
                continue
            _try(HFOp(f"transformers:act:{name}", "activation", source), ops, rejected)
        for arch in ARCHITECTURES:
            try:
                module = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
            except Exception as exc:
                rejected.append({"name": f"transformers:{arch}", "reason": f"import failed: {exc}"[:200]})
                continue
            for cls_name, cls in sorted(vars(module).items()):
                role = _role(cls_name, cls, module.__name__)
                if role is None:
                    continue
                if "Cross" in cls_name:
                    rejected.append({"name": f"transformers:{cls_name}", "reason": "cross attention: two inputs"})
                    continue
                try:
                    source = task_source(arch, module.__name__, cls_name, cls, role, SIZES)
                except ValueError as exc:
                    rejected.append({"name": f"transformers:{cls_name}", "reason": str(exc)})
                    continue
                _try(HFOp(f"transformers:{cls_name}", role, source), ops, rejected,
                     tiny=task_source(arch, module.__name__, cls_name, cls, role, TINY))
    return ops, rejected


def _role(name: str, cls, module_name: str) -> str | None:
    import torch

    if not (inspect.isclass(cls) and issubclass(cls, torch.nn.Module) and cls.__module__ == module_name):
        return None
    return next((role for role, suffixes in ROLES.items() if name.endswith(suffixes)), None)


def _activation_sources():
    from transformers.activations import ACT2CLS

    for name in sorted(ACT2CLS):
        yield name, _render(["from transformers.activations import ACT2FN"], [f"self.block = ACT2FN[{name!r}]"],
                            ["x = self.block(x)"], ["x"], ["BATCH, 4096"], batch=64)


def _try(op: HFOp, ops: list[HFOp], rejected: list[dict], tiny: str | None = None) -> None:
    """Keep `op` if its task runs at tiny sizes on the CPU and returns one floating-point tensor."""
    import torch


    try:
        module = load(tiny or with_batch(op.source, 2))
        model = module.Model(*module.get_init_inputs()).eval()
        with torch.no_grad():
            out = model(*module.get_inputs())
        if not (isinstance(out, torch.Tensor) and out.is_floating_point()):
            raise TypeError("the output is not one floating-point tensor")
    except Exception as exc:
        rejected.append({"name": op.name, "reason": f"{type(exc).__name__}: {exc}"[:200]})
        return
    ops.append(op)


def task_source(arch: str, module_name: str, cls_name: str, cls, role: str, sizes: dict) -> str:
    """The standalone task for one block of `arch` at `sizes` (ValueError when its signature is not understood)."""
    config = {k: sizes[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                    "num_key_value_heads", "head_dim")}
    config.update({"num_hidden_layers": 1, "vocab_size": 65536, "attn_implementation": "sdpa"})
    config.update(ARCH_EXTRA.get(arch, lambda s: {})(sizes))
    for key in ARCH_DERIVED.get(arch, ()):
        del config[key]
    imports = ["from transformers import AutoConfig", f"from {module_name} import {cls_name}"]
    ctor = "config=config" if role == "rotary" else _bind(cls.__init__, sizes)
    init = [f"config = AutoConfig.for_model({arch!r}, **CONFIG)", f"self.block = {cls_name}({ctor})"]
    hidden, seq, heads = sizes["hidden_size"], sizes["seq"], sizes["num_attention_heads"]
    if role in ("norm", "mlp"):
        body, args, shapes = ["x = self.block(x)"], ["x"], [f"BATCH, {seq}, {hidden}"]
    elif role == "attention":
        params = list(inspect.signature(cls.forward).parameters.values())[2:]
        call, rotary = [], False
        for p in params:
            if p.name == "position_embeddings":
                rotary = True
                call.append("position_embeddings=(cos, sin)")
            elif p.name == "position_ids":
                call.append("position_ids=positions")
            elif p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD:
                call.append(f"{p.name}=None")
        body = ["positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)"]
        if rotary:
            rotary_cls = _sibling(module_name, "RotaryEmbedding")
            imports[-1] += f", {rotary_cls}"
            init.append(f"self.rotary = {rotary_cls}(config=config)")
            body.append("cos, sin = self.rotary(x, positions)")
        body += [f"x = self.block(x, {', '.join(call)})", "x = x[0] if isinstance(x, tuple) else x"]
        args, shapes = ["x"], [f"BATCH, {seq}, {hidden}"]
    else:  # rotary: applied to a query and a key with the module's own helper
        if not hasattr(importlib.import_module(module_name), "apply_rotary_pos_emb"):
            raise ValueError("no apply_rotary_pos_emb beside the rotary embedding")
        imports[-1] += ", apply_rotary_pos_emb"
        head_dim = hidden // heads
        body = ["positions = torch.arange(q.shape[2], device=q.device).expand(q.shape[0], -1)",
                "cos, sin = self.block(q, positions)", "x = torch.cat(apply_rotary_pos_emb(q, k, cos, sin), dim=1)"]
        args = ["q", "k"]
        shapes = [f"BATCH, {heads}, {seq}, {head_dim}", f"BATCH, {sizes['num_key_value_heads']}, {seq}, {head_dim}"]
    return _render(imports, init, body, args, shapes, batch=2, config=config)


def _bind(init, sizes: dict) -> str:
    """Constructor arguments by parameter name; ValueError for a required one we cannot fill."""
    args = []
    for p in list(inspect.signature(init).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name == "config":
            args.append("config=config")
        elif p.name == "layer_idx":
            args.append("layer_idx=0")
        elif p.name in BY_NAME:
            args.append(f"{p.name}={sizes[BY_NAME[p.name]]}")
        elif p.default is inspect.Parameter.empty:
            raise ValueError(f"constructor needs '{p.name}'")
    return ", ".join(args)


def _sibling(module_name: str, suffix: str) -> str:
    module = importlib.import_module(module_name)
    found = [n for n in vars(module) if n.endswith(suffix) and _role(n, getattr(module, n), module_name)]
    if not found:
        raise ValueError(f"needs position embeddings but {module_name} has no *{suffix}")
    return found[0]


def _render(imports: list[str], init: list[str], body: list[str], args: list[str], shapes: list[str], batch: int,
            config: dict | None = None) -> str:
    pad = "\n        "
    inputs = ", ".join(f"torch.randn({s})" for s in shapes)
    return ("import torch\nimport torch.nn as nn\n" + "\n".join(imports) + "\n\n" +
            (f"CONFIG = {json.dumps(config)}\n\n" if config else "") +
            f"\nclass Model(nn.Module):\n    def __init__(self):\n        super().__init__(){pad}{pad.join(init)}\n\n"
            f"    def forward(self, {', '.join(args)}):{pad}{pad.join(body)}{pad}return x\n\n\n"
            f"BATCH = {batch}\n\n\ndef get_inputs():\n    return [{inputs}]\n\n\n"
            "def get_init_inputs():\n    return []\n")
