"""The C statements of one row of a row program: a loop over the row's elements for each reduction (softmax's max
and sum of exponentials merged into one online pass when `knobs.online`), then the pass that writes the row's
outputs, every element value recomputed from the input in each pass. `RowCode` streams the row from memory in each
pass (cpu, a CUDA block, a CUDA warp); rows_registers.py reads it once into registers."""

from __future__ import annotations

from .trace import Node, Program

INIT = {"sum": "0.f", "expsum": "0.f", "max": "-INFINITY"}
OP = {"sum": "FusedSum", "expsum": "FusedSum", "max": "FusedMax"}


def indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line if line else line for line in text.splitlines())


def _combine(node: Node, acc: str) -> str:
    if node.reduce == "max":
        return f"fmaxf({acc}, {node.src})"
    return f"{acc} + " + (f"expf({node.src} - {node.of})" if node.reduce == "expsum" else node.src)


class RowCode:
    """The C statements of one row, for the cpu (one thread), a CUDA block or a CUDA warp (`mode` "cpu", "block",
    "warp": its threads stride over the row)."""

    LOOPS = {"cpu": "c = 0; c < cols; ++c", "block": "c = threadIdx.x; c < cols; c += blockDim.x",
             "warp": "c = lane; c < cols; c += 32"}

    def __init__(self, program: Program, mode: str, knobs, name: str):
        self.program, self.mode, self.cuda, self.knobs, self.name = program, mode, mode != "cpu", knobs, name
        self.loop = f"for (int64_t {self.LOOPS[mode]})"

    def _reduce(self, value: str, init: str, op: str) -> str:
        """The row's total of every thread's `value` (the cpu's own value: it is the only thread)."""
        if self.mode == "warp":
            return f"{self.name}_warp_reduce({value}, {op}())"
        return f"{self.name}_block_reduce({value}, {init}, shm, {op}())" if self.cuda else value

    def _pass(self, before: int, init: list[str], update: str, simd: str | None = None) -> list[str]:
        """A loop over the row's elements (`simd`: the cpu loop's `omp simd` clauses; None: not vectorised)."""
        elements = indent(self.program.elements(before), 4)
        pragma = [f"#pragma omp simd{simd}"] if simd is not None and not self.cuda and self.knobs.simd else []
        return [*init, *pragma, f"{self.loop} {{", "    const float v0 = xr[c];", *elements.splitlines(),
                f"    {update}", "}"]

    def lines(self) -> list[str]:
        out, nodes, i = [], self.program.nodes, 0
        while i < len(nodes):
            node = nodes[i]
            merged = (self.knobs.online and node.reduce == "max" and i + 1 < len(nodes)
                      and nodes[i + 1].reduce == "expsum" and nodes[i + 1].of == node.name)
            if merged:
                out += self._online(i, node, nodes[i + 1])
                i += 2
                continue
            if node.reduce:
                acc = f"acc_{node.name}"
                clause = f" reduction({'max' if node.reduce == 'max' else '+'}:{acc})"
                out += self._pass(i, [f"float {acc} = {INIT[node.reduce]};"], f"{acc} = {_combine(node, acc)};",
                                  clause)
                out.append(f"const float {node.name} = {self._reduce(acc, INIT[node.reduce], OP[node.reduce])};")
            elif node.kind == "r":
                out.append(f"const float {node.name} = {node.expr};")
            i += 1
        return out + self._store(self.program.output)

    def _store(self, result: str) -> list[str]:
        """The row's outputs: one value (by the row's first thread) or a pass writing every element."""
        if self.program.reduced:
            first = {"cpu": "", "block": "if (threadIdx.x == 0) ", "warp": "if (lane == 0) "}[self.mode]
            return [f"{first}out[row] = {result};"]
        return self._pass(len(self.program.nodes), [], f"out[row * cols + c] = {result};", "")

    def _online(self, i: int, m: Node, s: Node) -> list[str]:
        """The row's maximum and sum of exp(x - maximum) in one pass, rescaling the sum when the maximum grows."""
        mt, st = f"m_{m.name}", f"s_{s.name}"
        update = (f"if ({m.src} > {mt}) {{ {st} = {st} * expf({mt} - {m.src}) + 1.f; {mt} = {m.src}; }} "
                  f"else {{ {st} += expf({m.src} - {mt}); }}")
        out = self._pass(i, [f"float {mt} = -INFINITY, {st} = 0.f;"], update)
        if self.cuda:
            return out + [f"const float {m.name} = {self._reduce(mt, '-INFINITY', 'FusedMax')};",
                          f"const float {s.name} = {self._reduce(f'{st} * expf({mt} - {m.name})', '0.f', 'FusedSum')};"]
        return out + [f"const float {m.name} = {mt};", f"const float {s.name} = {st};"]
