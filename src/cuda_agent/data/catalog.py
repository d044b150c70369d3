"""Crawl: the operators a fused task can be made of, found in `torch.nn` and `torch` itself.

Every `torch.nn` module class is tried: its constructor's parameter names say what family it belongs to
(convolution, linear, norm, pooling, activation...), which gives constructor arguments and an input layout; the
module is then built and run once on the `meta` device. What cannot be instantiated that way is recorded with the
reason. Functional and tensor ops come from a list of element-wise and reduction calls, checked the same way.
"""

from __future__ import annotations

import inspect
import re
import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn

LAYOUTS = {  # input rank -> (name, base shape at CPU-test scale; the composer scales the batch)
    2: ("ND", (8, 256)),
    3: ("NCL", (8, 32, 256)),
    4: ("NCHW", (8, 32, 32, 32)),
    5: ("NCDHW", (4, 16, 16, 16, 16)),
}
LONG_ROWS = {  # input rank -> base shapes with long rows (last dimension), drawn for the expert family
    2: ((8, 2048), (8, 8192)),
    3: ((8, 16, 1024), (8, 4, 4096)),
}
STOCHASTIC = re.compile(r"Dropout|RReLU")
SKIP = {  # reason for module classes that are not single-tensor operators
    "containers or wrappers": re.compile(r"^(Module|Sequential|ModuleList|ModuleDict|ParameterList|ParameterDict|"
                                         r"Container|Identity|Flatten|Unflatten|LazyModuleMixin)$|^Lazy"),
    "needs several inputs or integer inputs (losses, attention, bilinear, embeddings, recurrent state)": re.compile(
        r"Loss$|Attention|Bilinear|Transformer|RNN|LSTM|GRU|Embedding|CosineSimilarity|PairwiseDistance|"
        r"MaxUnpool|AdaptiveLogSoftmax|LogSoftmaxWithLoss"),
    "layout-changing or random-sized (padding, folding, shuffles, upsampling, fractional pooling)": re.compile(
        r"Fold$|Unfold$|ChannelShuffle|Upsampl|PixelShuffle|PixelUnshuffle|FractionalMaxPool|ZeroPad|"
        r"ConstantPad|ReflectionPad|ReplicationPad|CircularPad"),
    "distributed or needs a hand-written recipe": re.compile(
        r"SyncBatchNorm|DataParallel|Threshold$|CrossMapLRN2d|Softmax2d|RMSNorm|LocalResponseNorm"),
}
FUNCTIONS = {  # name -> call on `x` (element-wise and reductions; shape rules checked on meta)
    "torch.relu": "torch.relu(x)", "torch.tanh": "torch.tanh(x)", "torch.sigmoid": "torch.sigmoid(x)",
    "torch.exp": "torch.exp(x)", "torch.abs": "torch.abs(x)", "torch.sin": "torch.sin(x)",
    "torch.clamp": "torch.clamp(x, min=-0.5, max=0.5)", "F.gelu": "F.gelu(x)", "F.silu": "F.silu(x)",
    "F.softplus": "F.softplus(x)", "F.mish": "F.mish(x)", "F.leaky_relu": "F.leaky_relu(x, 0.1)",
    "torch.softmax": "torch.softmax(x, dim=-1)", "torch.log_softmax": "torch.log_softmax(x, dim=-1)",
    "torch.cumsum": "torch.cumsum(x, dim=-1)", "torch.mean": "torch.mean(x, dim=-1, keepdim=True)",
    "torch.sum": "torch.sum(x, dim=1, keepdim=True)", "torch.amax": "torch.amax(x, dim=-1, keepdim=True)",
    "torch.mul": "x * 2.0", "torch.add": "x + 1.0", "torch.square": "x * x",
    "torch.norm": "x / (x.norm(dim=-1, keepdim=True) + 1e-6)", "torch.transpose": "x.transpose(-1, -2)",
}


@dataclass
class Op:
    """One operator: how to build it for an input of a given layout and channel count."""
    name: str  # "nn.Conv2d" or "torch.tanh"
    kind: str  # "module" or "function"
    ranks: tuple[int, ...]  # input ranks it accepts
    init: str = ""  # constructor expression with {c} (input channels/features) and {c2} (output channels)
    call: str = ""  # for functions: expression in x

    def expression(self, attr: str) -> str:
        return f"self.{attr}(x)" if self.kind == "module" else self.call


def _dims(name: str) -> tuple[int, ...]:
    match = re.search(r"([123])d$", name)
    return (int(match.group(1)) + 2,) if match else tuple(LAYOUTS)


def _recipe(name: str, params: list[str]) -> tuple[str, tuple[int, ...]] | None:
    """Constructor arguments from the parameter names; None when no family matches."""
    ranks = _dims(name)
    if {"in_channels", "out_channels", "kernel_size"} <= set(params):
        return f"nn.{name}({{c}}, {{c2}}, 3, padding=1)", ranks
    if {"in_features", "out_features"} <= set(params):
        return f"nn.{name}({{c}}, {{c2}})", (2,)
    if "num_groups" in params and "num_channels" in params:
        return f"nn.{name}(4, {{c}})", (3, 4, 5)
    if "num_features" in params:
        return f"nn.{name}({{c}})", ranks if ranks != tuple(LAYOUTS) else (2, 3, 4, 5)
    if "normalized_shape" in params:
        return f"nn.{name}({{last}})", tuple(LAYOUTS)
    if "norm_type" in params and "kernel_size" in params:
        return f"nn.{name}(2, 2)", ranks
    if "output_size" in params:
        return f"nn.{name}(4)", ranks
    if "kernel_size" in params:
        return f"nn.{name}(2)", ranks
    if "dim" in params:
        return f"nn.{name}(dim=-1)", tuple(LAYOUTS)
    return None


def _required(cls: type) -> list[str]:
    try:
        sig = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return []
    return [p.name for p in list(sig.parameters.values())[1:]
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def instantiate(op: Op, shape: tuple[int, ...], c2: int | None = None):
    """The operator built for an input of `shape` (callable on x); raises if it does not fit."""
    if op.kind == "function":
        import torch.nn.functional as F  # noqa: F401  (used by the evaluated call)

        return eval(f"lambda x: {op.call}", {"torch": torch, "F": F})
    channels = shape[1] if len(shape) > 1 else shape[0]
    expr = op.init.format(c=channels, c2=c2 or channels, last=shape[-1])
    return eval(expr, {"nn": nn, "torch": torch})


def check(op: Op, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Run the operator once on the meta device; returns the output shape."""
    with torch.device("meta"):
        fn = instantiate(op, shape)
        out = fn(torch.empty(shape))
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"returns {type(out).__name__}, not one tensor")
    return tuple(out.shape)


def crawl() -> tuple[list[Op], list[dict]]:
    """(usable operators, rejected ones with the reason)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _crawl()


def crawl_all(transformers: bool) -> tuple[list[Op], list[dict], list, list[dict]]:
    """(torch operators, their rejects, transformers operators, their rejects); the last two empty when
    `transformers` is False. Raises ImportError when it is True and transformers is not installed."""
    if not transformers:
        return (*crawl(), [], [])
    from .transformers_ops import crawl_transformers

    return (*crawl(), *crawl_transformers())


def _crawl() -> tuple[list[Op], list[dict]]:
    ops: list[Op] = []
    rejected: list[dict] = []
    names = sorted(n for n in dir(nn) if isinstance(getattr(nn, n), type) and issubclass(getattr(nn, n), nn.Module))
    for name in names:
        reason = next((why for why, pattern in SKIP.items() if pattern.search(name)), None)
        if reason is None and STOCHASTIC.search(name):
            reason = "stochastic"
        recipe = None if reason else _recipe(name, _required(getattr(nn, name)))
        if reason is None and recipe is None:
            if "dim" in inspect.signature(getattr(nn, name).__init__).parameters:
                recipe = (f"nn.{name}(dim=-1)", tuple(LAYOUTS))
            elif _required(getattr(nn, name)):
                reason = f"no recipe for constructor arguments {_required(getattr(nn, name))}"
            else:
                recipe = (f"nn.{name}()", tuple(LAYOUTS))
        if reason:
            rejected.append({"name": f"nn.{name}", "reason": reason})
            continue
        op = Op(f"nn.{name}", "module", recipe[1], init=recipe[0])
        reason = _validate(op)
        if reason:
            rejected.append({"name": op.name, "reason": reason})
        else:
            ops.append(op)
    for name, call in FUNCTIONS.items():
        op = Op(name, "function", tuple(LAYOUTS), call=call)
        reason = _validate(op)
        (rejected.append({"name": name, "reason": reason}) if reason else ops.append(op))
    return ops, rejected


def _validate(op: Op) -> str | None:
    """Keep the ranks at which the op runs on meta; None if at least one does, else why not."""
    good, errors = [], []
    for rank in op.ranks:
        try:
            check(op, LAYOUTS[rank][1])
            good.append(rank)
        except Exception as exc:  # any failure means: not at this rank
            errors.append(f"rank {rank}: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}")
    op.ranks = tuple(good)
    return None if good else "; ".join(errors)[:300]

