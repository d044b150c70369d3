"""The reduction family's kernel: one row (the last dimension) at a time, a pass over the row for each reduction
(softmax's max and sum of exponentials merged into one online pass when `knobs.online`), then one pass that writes
the row's outputs; every element value recomputed from the input in each pass (the row stays in cache).
CUDA: one block per row, the block's partial results combined with warp shuffles or a shared-memory tree."""

from __future__ import annotations

from .trace import Node, Program

CPU = """// {ops}: one row at a time (knobs: {knobs}).
#include <cmath>
#include <cstdint>

struct FusedParams {{ const float* p[{max_params}]; }};

extern "C" void {name}_launcher(float* out, const float* x, int64_t rows, int64_t cols, FusedParams p, int config) {{
    (void)config;
{pragma}    for (int64_t row = 0; row < rows; ++row) {{
        const float* xr = x + row * cols;
{row}
    }}
}}
"""

CUDA = """// {ops}: one block per row (knobs: {knobs}).
#include <cuda_runtime.h>
#include <cstdint>

struct FusedParams {{ const float* p[{max_params}]; }};
struct FusedSum {{ __device__ float operator()(float a, float b) const {{ return a + b; }} }};
struct FusedMax {{ __device__ float operator()(float a, float b) const {{ return fmaxf(a, b); }} }};

// Every thread's `v` combined; every thread gets the result.
template <class Op>
__device__ float {name}_block_reduce(float v, float init, float* shm, Op op) {{
{reduce}
}}

__global__ void {name}_kernel(float* __restrict__ out, const float* __restrict__ x, int64_t rows, int64_t cols,
                              FusedParams p) {{
    __shared__ float shm[{shm}];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {{
        const float* xr = x + row * cols;
{row}
    }}
}}

extern "C" void {name}_launcher(float* out, const float* x, int64_t rows, int64_t cols, FusedParams p, int config,
                                cudaStream_t stream) {{
    (void)config;
    const int64_t blocks = rows < 65535 ? rows : 65535;
    {name}_kernel<<<(unsigned)blocks, {threads}, 0, stream>>>(out, x, rows, cols, p);
}}
"""

WARP = """    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // the previous reduction's result has been read
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? shm[lane] : init;
        for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) shm[0] = v;
    }
    __syncthreads();
    return shm[0];"""

SHARED = """    __syncthreads();  // the previous reduction's result has been read
    shm[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shm[threadIdx.x] = op(shm[threadIdx.x], shm[threadIdx.x + s]);
        __syncthreads();
    }
    return shm[0];"""

INIT = {"sum": "0.f", "expsum": "0.f", "max": "-INFINITY"}
OP = {"sum": "FusedSum", "expsum": "FusedSum", "max": "FusedMax"}


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line if line else line for line in text.splitlines())


def _combine(node: Node, acc: str) -> str:
    if node.reduce == "max":
        return f"fmaxf({acc}, {node.src})"
    return f"{acc} + " + (f"expf({node.src} - {node.of})" if node.reduce == "expsum" else node.src)


class RowCode:
    """The C statements of one row, for the cpu (one thread) or a CUDA block (threads stride over the row)."""

    def __init__(self, program: Program, cuda: bool, knobs, name: str):
        self.program, self.cuda, self.knobs, self.name = program, cuda, knobs, name
        loop = "c = threadIdx.x; c < cols; c += blockDim.x" if cuda else "c = 0; c < cols; ++c"
        self.loop = f"for (int64_t {loop})"

    def _pass(self, before: int, init: list[str], update: str, simd: str | None = None) -> list[str]:
        """A loop over the row's elements (`simd`: the cpu loop's `omp simd` clauses; None: not vectorised)."""
        elements = _indent(self.program.elements(before), 4)
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
                total = (f"{self.name}_block_reduce({acc}, {INIT[node.reduce]}, shm, {OP[node.reduce]}())"
                         if self.cuda else acc)
                out.append(f"const float {node.name} = {total};")
            elif node.kind == "r":
                out.append(f"const float {node.name} = {node.expr};")
            i += 1
        result = self.program.output
        if self.program.reduced:
            out.append(f"{'if (threadIdx.x == 0) ' if self.cuda else ''}out[row] = {result};")
        else:
            out += self._pass(len(nodes), [], f"out[row * cols + c] = {result};", "")
        return out

    def _online(self, i: int, m: Node, s: Node) -> list[str]:
        """The row's maximum and sum of exp(x - maximum) in one pass, rescaling the sum when the maximum grows."""
        mt, st = f"m_{m.name}", f"s_{s.name}"
        update = (f"if ({m.src} > {mt}) {{ {st} = {st} * expf({mt} - {m.src}) + 1.f; {mt} = {m.src}; }} "
                  f"else {{ {st} += expf({m.src} - {mt}); }}")
        out = self._pass(i, [f"float {mt} = -INFINITY, {st} = 0.f;"], update)
        if self.cuda:
            return out + [f"const float {m.name} = {self.name}_block_reduce({mt}, -INFINITY, shm, FusedMax());",
                          f"const float {s.name} = {self.name}_block_reduce({st} * expf({mt} - {m.name}), 0.f, shm, "
                          "FusedSum());"]
        return out + [f"const float {m.name} = {mt};", f"const float {s.name} = {st};"]


def source(program: Program, cuda: bool, knobs, name: str, max_params: int) -> str:
    row = _indent("\n".join(RowCode(program, cuda, knobs, name).lines()), 8)
    common = dict(name=name, ops=" -> ".join(program.ops), row=row, max_params=max_params)
    if not cuda:
        return CPU.format(**common, pragma="#pragma omp parallel for schedule(static)\n" if knobs.parallel else "",
                          knobs=f"parallel={knobs.parallel}, simd={knobs.simd}, online={knobs.online}")
    return CUDA.format(**common, threads=knobs.threads, reduce=WARP if knobs.reduce == "warp" else SHARED,
                       shm=32 if knobs.reduce == "warp" else knobs.threads,
                       knobs=f"threads={knobs.threads}, reduce={knobs.reduce}, online={knobs.online}")
