"""A task's `Model` traced with torch.fx into a row program the expert can fuse: one float32 input, each value either
an element of a row (`v{i}`) or one number per row (`r{i}`, made by a reduction over the last dimension), every
step a C expression valid in C++ and CUDA device code alike.

Three families come out of it: pointwise chains (element values only, no parameters: `Program.pointwise`);
pointwise -> last-dim reduction (softmax, log-softmax, softmin, sum/mean/amax, L2 normalisation, LayerNorm with its
weight and bias) -> pointwise; and a GEMM (`nn.Linear` as the first op, `Program.gemm`) whose output, bias included,
is the input of such a program (its epilogue). Anything else (several inputs, other dimensions, an op without a
formula here) is `Unsupported`, with why.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ...data.taskfile import load
from .formulas import BINARY, MODULE_CONSTANTS, MODULES, POSITIONAL, Unsupported, const, unary


@dataclass
class Node:
    """One value: `kind` "e" (per element) or "r" (per row); `expr` its C expression, or for a reduction (`reduce`
    "sum", "max", or "expsum": the sum of expf(src - of)) the value `src` it reduces."""
    name: str
    kind: str
    expr: str = ""
    reduce: str = ""
    src: str = ""
    of: str = ""  # expsum: the row maximum it is taken against (online softmax merges the two passes)


@dataclass
class Program:
    nodes: list[Node]
    shape: tuple[int, ...]
    ops: list[str]  # the task's ops, by name (for the run's description)
    params: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)  # state-dict name, shape; C name p[i]
    output: str = ""  # the name of the value returned
    keepdim: bool = True  # a per-row output keeps the last dimension (size 1)
    gemm: bool = False  # v0 is an element of x @ params[0].T (nn.Linear's weight; its bias is an element node)
    steps: list[tuple[str, list[str]]] = field(default_factory=list)  # each op of `ops` and the values it made

    @property
    def pointwise(self) -> bool:
        return not self.params and all(n.kind == "e" for n in self.nodes)

    @property
    def cols(self) -> int:
        """The row length the kernel sees: the input's last dimension, or the GEMM's output features."""
        return self.params[0][1][0] if self.gemm else self.shape[-1]

    @property
    def reduced(self) -> bool:
        """The output is one value per row."""
        return self.output.startswith("r")

    def elements(self, before: int | None = None) -> str:
        """C statements of the element values (those defined before node `before`), from `v0`, the input's."""
        nodes = self.nodes[:before]
        return "\n".join(f"const float {n.name} = {n.expr};" for n in nodes if n.kind == "e")


class Builder:
    """Nodes appended in the traced order; each helper returns the new value's name."""

    def __init__(self):
        self.nodes: list[Node] = []

    def add(self, kind: str, expr: str = "", **reduce) -> str:
        name = f"{'v' if kind == 'e' else 'r'}{len(self.nodes) + 1}"
        self.nodes.append(Node(name, kind, expr, **reduce))
        return name

    def softmax(self, a: str, log: bool = False, negate: bool = False) -> str:
        if negate:
            a = self.add("e", f"(-{a})")
        m = self.add("r", reduce="max", src=a)
        s = self.add("r", reduce="expsum", src=a, of=m)
        return self.add("e", f"({a} - {m} - logf({s}))" if log else f"(expf({a} - {m}) / {s})")

    def layer_norm(self, a: str, eps: float, weight: str | None, bias: str | None) -> str:
        total = self.add("r", reduce="sum", src=a)
        d = self.add("e", f"({a} - {total} / (float)cols)")
        squares = self.add("r", reduce="sum", src=self.add("e", f"({d} * {d})"))
        out = f"{d} / sqrtf({squares} / (float)cols + {const(eps)})"
        out = f"{out} * {weight}[c]" if weight else out
        return self.add("e", f"({out} + {bias}[c])" if bias else f"({out})")


def _last_dim(dim, rank: int, name: str) -> None:
    if not isinstance(dim, int) or dim % rank != rank - 1:
        raise Unsupported(f"{name} over a dimension other than the last")


def trace(source: str) -> Program:
    """A task's Model (its source) as a row program, or Unsupported."""
    module = load(source)
    with torch.device("meta"):  # shapes only: a GPU-sized task's inputs are gigabytes
        model = module.Model(*module.get_init_inputs())
        inputs = module.get_inputs()
    if any(True for _ in model.buffers()):
        raise Unsupported("the model has buffers")
    if len(inputs) != 1 or not isinstance(inputs[0], torch.Tensor) or inputs[0].dtype != torch.float32:
        raise Unsupported("not one float32 tensor input")
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception as exc:  # control flow on values, unsupported Python
        raise Unsupported(f"torch.fx cannot trace it ({type(exc).__name__}: {exc})"[:300]) from None
    rank, b, params = inputs[0].dim(), Builder(), []
    cols = inputs[0].shape[-1]
    names: dict[torch.fx.Node, str] = {}
    ops, output, keepdim = [], "", True
    gemm = _linear_first(graph, model)
    if gemm is not None:
        cols = model.get_submodule(gemm.target).out_features
    steps = []
    for node in graph.nodes:
        made = len(b.nodes)
        if node.op == "placeholder":
            if names:
                raise Unsupported("more than one input")
            names[node] = "v0"
        elif node is gemm:
            sub = model.get_submodule(node.target)
            params.append((f"{node.target}.weight", tuple(sub.weight.shape)))
            names[node] = "v0"
            if sub.bias is not None:
                params.append((f"{node.target}.bias", tuple(sub.bias.shape)))
                names[node] = b.add("e", "(v0 + p.p[1][c])")
            ops.append("linear")
            steps.append(("linear", [n.name for n in b.nodes[made:]]))
        elif node.op == "output":
            if node.args[0] not in names:
                raise Unsupported("the output is not one tensor of the program")
            output = names[node.args[0]]
        else:
            name, values, kw = _op(node, model, names)
            if name in REDUCTIONS or name in ("layer_norm", "prelu"):
                if not values or not isinstance(values[0], str) or values[0].startswith("r"):
                    raise Unsupported(f"{name} of a constant or of a reduced row")
            if name in ("layer_norm", "prelu"):
                names[node] = _with_parameters(b, model.get_submodule(node.target), node.target, values[0], params,
                                               cols)
            elif name in REDUCTIONS:
                names[node], node_keepdim = REDUCTIONS[name](b, values[0], kw, rank, name)
                keepdim = keepdim and node_keepdim
            else:
                if any(isinstance(v, str) and v.startswith("r") for v in values) and not keepdim:
                    raise Unsupported("a row value without its kept dimension used again")
                kind = "e" if any(isinstance(v, str) and v.startswith("v") for v in values) else "r"
                names[node] = b.add(kind, _expression(name, values, kw))
            ops.append(name)
            steps.append((name, [n.name for n in b.nodes[made:]] or [names[node]]))
    if output == "v0" and gemm is None:
        raise Unsupported("the model computes nothing")
    if sorted(name for name, _ in model.named_parameters()) != sorted({name for name, _ in params}):
        raise Unsupported("the model has parameters that no traced op uses")
    program = Program(b.nodes, tuple(inputs[0].shape), ops, params, output, keepdim, gemm is not None, steps)
    with torch.no_grad():
        out = model(inputs[0])
    rows_shape = tuple(inputs[0].shape[:-1])
    expected = rows_shape + ((1,) if keepdim else ()) if program.reduced else rows_shape + (cols,)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(expected) or out.dtype != torch.float32:
        raise Unsupported(f"the output's shape {tuple(getattr(out, 'shape', ()))} is not the one traced")
    return program


def _linear_first(graph: torch.fx.Graph, model: nn.Module) -> torch.fx.Node | None:
    """The node of an `nn.Linear` applied to the input and the input's only use (the GEMM family), else None."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    users = list(placeholders[0].users) if len(placeholders) == 1 else []
    if len(users) != 1 or users[0].op != "call_module":
        return None
    return users[0] if isinstance(model.get_submodule(users[0].target), nn.Linear) else None


def _with_parameters(b: Builder, sub: nn.Module, target: str, a: str, params: list, cols: int) -> str:
    """LayerNorm over the last dimension or PReLU with one slope: its parameters become the kernel's `p.p[i]`."""
    def param(name: str) -> str | None:
        if getattr(sub, name, None) is None:
            return None
        params.append((f"{target}.{name}", tuple(getattr(sub, name).shape)))
        return f"p.p[{len(params) - 1}]"

    if isinstance(sub, nn.PReLU):
        if sub.weight.numel() != 1:
            raise Unsupported("PReLU with a slope per channel")
        return b.add("e", f"({a} > 0.f ? {a} : {param('weight')}[0] * {a})")
    if tuple(sub.normalized_shape) != (cols,):
        raise Unsupported("LayerNorm over more than the last dimension")
    return b.layer_norm(a, float(sub.eps), param("weight"), param("bias"))


def _reduce(op: str, post: str = "{r}"):
    def build(b: Builder, a: str, kw: dict, rank: int, name: str) -> tuple[str, bool]:
        _last_dim(kw.get("dim"), rank, name)
        if op == "norm" and kw.get("p", 2) not in (2, "fro", None):
            raise Unsupported("a norm other than L2")
        r = b.add("r", reduce="sum" if op != "max" else "max", src=b.add("e", f"({a} * {a})") if op == "norm" else a)
        return (b.add("r", post.format(r=r)) if post != "{r}" else r), bool(kw.get("keepdim", False))
    return build


def _softmax(log: bool = False, negate: bool = False):
    def build(b: Builder, a: str, kw: dict, rank: int, name: str) -> tuple[str, bool]:
        _last_dim(kw.get("dim"), rank, name)
        return b.softmax(a, log, negate), True
    return build


REDUCTIONS = {"sum": _reduce("sum"), "mean": _reduce("sum", "({r} / (float)cols)"), "amax": _reduce("max"),
              "norm": _reduce("norm", "sqrtf({r})"), "softmax": _softmax(), "log_softmax": _softmax(log=True),
              "softmin": _softmax(negate=True)}


def _name(target) -> str:
    """An fx call target's op name: torch.relu, F.relu, operator.mul, "relu" (a method) -> relu, mul."""
    return (target if isinstance(target, str) else getattr(target, "__name__", str(target))).rstrip("_")


def _op(node: torch.fx.Node, model: nn.Module, names: dict) -> tuple[str, list, dict]:
    """The op of a node: its name, its arguments (value names or constants), its keyword constants."""
    def value(a):
        if isinstance(a, torch.fx.Node):
            if a not in names:
                raise Unsupported(f"{node.target} uses a value the program does not have")
            return names[a]
        return a

    if node.op == "call_module":
        sub = model.get_submodule(node.target)
        if isinstance(sub, (nn.LayerNorm, nn.PReLU)):
            return "layer_norm" if isinstance(sub, nn.LayerNorm) else "prelu", [value(a) for a in node.args], {}
        kind = MODULES.get(type(sub))
        if kind is None:
            raise Unsupported(f"module {type(sub).__name__} has no formula here")
        if any(True for _ in sub.parameters()):
            raise Unsupported(f"module {type(sub).__name__} has parameters")
        return kind, [value(a) for a in node.args], {k: getattr(sub, k) for k in MODULE_CONSTANTS if hasattr(sub, k)}
    if node.op not in ("call_function", "call_method"):
        raise Unsupported(f"{node.op} {node.target} has no formula here")
    name = "neg" if node.target is operator.neg else _name(node.target)
    if name in BINARY or name == "pow":
        return name, [value(a) for a in node.args], {}
    if name in REDUCTIONS:
        kw = dict(zip(("dim", "keepdim") if name != "norm" else ("p", "dim", "keepdim"), node.args[1:]))
        return name, [value(node.args[0])], {**kw, **node.kwargs}
    return name, [value(a) for a in node.args[:1]], {**dict(zip(POSITIONAL.get(name, ()), node.args[1:])),
                                                      **node.kwargs}


def _expression(name: str, values: list, kw: dict) -> str:
    if name in BINARY or name == "pow":
        if len(values) != 2 or not all(isinstance(v, (str, int, float)) for v in values):
            raise Unsupported(f"{name} of a non-scalar")
        a, b = (v if isinstance(v, str) else const(v) for v in values)
        if name != "pow":
            return f"({a} {BINARY[name]} {b})"
        if values[1] == 2:
            return f"({a} * {a})"
        raise Unsupported("pow with an exponent other than 2")
    if not values or not isinstance(values[0], str):
        raise Unsupported(f"{name} of a constant")
    return unary(name, values[0], kw)
