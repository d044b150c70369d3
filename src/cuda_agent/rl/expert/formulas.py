"""The C formula of each element-wise op the expert fuses (valid in C++ and CUDA device code), and how torch.fx
names them: modules, functions, methods and operators."""

from __future__ import annotations

import torch.nn as nn


class Unsupported(ValueError):
    """The task is not one the expert can write a kernel for."""


def const(x: float) -> str:
    return f"{float(x)!r}f".replace("inf", "INFINITY")


def unary(name: str, a: str, kw: dict) -> str:
    """The C expression of a unary op on value `a` (its keyword constants in `kw`)."""
    if name == "relu":
        return f"fmaxf({a}, 0.f)"
    if name == "relu6":
        return f"fminf(fmaxf({a}, 0.f), 6.f)"
    if name == "leaky_relu":
        return f"({a} > 0.f ? {a} : {a} * {const(kw.get('negative_slope', 0.01))})"
    if name == "gelu":
        if kw.get("approximate", "none") == "tanh":
            return f"0.5f * {a} * (1.f + tanhf(0.7978845608f * ({a} + 0.044715f * {a} * {a} * {a})))"
        return f"0.5f * {a} * (1.f + erff({a} * 0.7071067812f))"
    if name in ("silu", "swish"):
        return f"{a} / (1.f + expf(-{a}))"
    if name == "sigmoid":
        return f"1.f / (1.f + expf(-{a}))"
    if name == "logsigmoid":
        return f"(fminf({a}, 0.f) - log1pf(expf(-fabsf({a}))))"
    if name == "softplus":
        beta, threshold = float(kw.get("beta", 1.0)), float(kw.get("threshold", 20.0))
        return f"({a} * {const(beta)} > {const(threshold)} ? {a} : log1pf(expf({a} * {const(beta)})) / {const(beta)})"
    if name == "mish":
        return f"{a} * tanhf({a} > 20.f ? {a} : log1pf(expf({a})))"
    if name in ("clamp", "clip", "hardtanh"):
        low = kw.get("min", kw.get("min_val", -1.0 if name == "hardtanh" else None))
        high = kw.get("max", kw.get("max_val", 1.0 if name == "hardtanh" else None))
        out = a if low is None else f"fmaxf({a}, {const(low)})"
        return out if high is None else f"fminf({out}, {const(high)})"
    if name in ("elu", "celu"):
        alpha = const(kw.get("alpha", 1.0))
        return f"({a} > 0.f ? {a} : {alpha} * (expf({a}{' / ' + alpha if name == 'celu' else ''}) - 1.f))"
    if name == "selu":
        return f"1.0507009873554805f * ({a} > 0.f ? {a} : 1.6732632423543772f * (expf({a}) - 1.f))"
    if name == "hardsigmoid":
        return f"fminf(fmaxf({a} / 6.f + 0.5f, 0.f), 1.f)"
    if name == "hardswish":
        return f"{a} * fminf(fmaxf({a} / 6.f + 0.5f, 0.f), 1.f)"
    if name in ("hardshrink", "softshrink"):
        lam = const(kw.get("lambd", 0.5))
        if name == "hardshrink":
            return f"(fabsf({a}) > {lam} ? {a} : 0.f)"
        return f"({a} > {lam} ? {a} - {lam} : ({a} < -{lam} ? {a} + {lam} : 0.f))"
    if name == "softsign":
        return f"({a} / (1.f + fabsf({a})))"
    if name == "tanhshrink":
        return f"({a} - tanhf({a}))"
    simple = {"tanh": "tanhf", "exp": "expf", "abs": "fabsf", "sin": "sinf", "cos": "cosf", "sqrt": "sqrtf",
              "log": "logf", "erf": "erff", "floor": "floorf", "ceil": "ceilf"}
    if name in simple:
        return f"{simple[name]}({a})"
    if name == "neg":
        return f"(-{a})"
    if name == "square":
        return f"({a} * {a})"
    raise Unsupported(f"no formula for {name}")


BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "truediv": "/"}
MODULES = {nn.ReLU: "relu", nn.ReLU6: "relu6", nn.LeakyReLU: "leaky_relu", nn.GELU: "gelu", nn.SiLU: "silu",
           nn.Sigmoid: "sigmoid", nn.LogSigmoid: "logsigmoid", nn.Tanh: "tanh", nn.Softplus: "softplus",
           nn.Mish: "mish", nn.Hardtanh: "hardtanh", nn.ELU: "elu", nn.CELU: "celu", nn.SELU: "selu",
           nn.Hardsigmoid: "hardsigmoid", nn.Hardswish: "hardswish", nn.Hardshrink: "hardshrink",
           nn.Softshrink: "softshrink", nn.Softsign: "softsign", nn.Tanhshrink: "tanhshrink", nn.Softmax: "softmax",
           nn.LogSoftmax: "log_softmax", nn.Softmin: "softmin"}
MODULE_CONSTANTS = ("negative_slope", "approximate", "beta", "threshold", "min_val", "max_val", "alpha", "lambd",
                    "dim")
POSITIONAL = {"leaky_relu": ("negative_slope",), "clamp": ("min", "max"), "clip": ("min", "max"),
              "hardtanh": ("min_val", "max_val"), "softplus": ("beta", "threshold"), "elu": ("alpha",),
              "celu": ("alpha",)}
