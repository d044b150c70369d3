"""The rows family's register-resident CUDA kernel (`knobs.registers`): each row read from memory once, into the
registers of the threads that own it, every reduction pass and the output pass then run over those registers, so the
kernel moves the bytes of one read and one write (the streaming kernels of rows.py read the row again in each pass).

A row goes to a group of `group` threads: a power of two up to a warp (several short rows per warp, reduced with
shuffles inside the group) or, for rows longer than `WARP_COLS` or without `knobs.warp_rows`, the whole block
(reduced through shared memory). Thread `g` of a group holds `chunks` runs of `vector` consecutive elements
(float4 loads and stores when the row length allows), run `q` at element `(q * group + g) * vector`, so each load
instruction of a group covers one contiguous span. The plan is sized for the task's row length; the launcher takes
this kernel only for rows it holds (and, for float4, 16-byte aligned rows), any other shape the streaming kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .row_code import RowCode, indent
from .trace import Program

WARP_COLS = 1024  # rows at most this long go to groups within a warp (`knobs.warp_rows`)
PER_THREAD = 32  # at most this many of a row's elements in one thread's registers
TARGET = 8  # elements per thread a warp group is sized for (short rows: 16 elements -> 2 threads, 8 rows a warp)


@dataclass(frozen=True)
class Plan:
    group: int  # threads per row: 1, 2, 4, ... 32 (lanes of one warp) or the block's threads
    chunks: int  # runs of `vector` elements per thread
    vector: int  # 4: float4 loads and stores, 1: one float
    block: bool  # the group is the whole block
    threads: int  # threads per block

    @property
    def capacity(self) -> int:
        return self.group * self.chunks * self.vector


def plan(cols: int, knobs) -> Plan | None:
    """How the kernel holds rows of `cols` elements (None: longer than registers hold). A block gets more threads
    than `knobs.threads` when a row needs them (up to 1,024)."""
    vector = 4 if knobs.vector == 4 and cols % 4 == 0 else 1
    if knobs.warp_rows and cols <= WARP_COLS:
        group = min(32, _power_of_two(math.ceil(cols / TARGET)))
        return Plan(group, math.ceil(cols / (group * vector)), vector, False, knobs.threads)
    threads = max(knobs.threads, _power_of_two(math.ceil(cols / PER_THREAD)))
    return Plan(threads, math.ceil(cols / (threads * vector)), vector, True, threads) if threads <= 1024 else None


def _power_of_two(n: int) -> int:
    """The least power of two >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


class RegisterRowCode(RowCode):
    """One row's statements over the registers `xv` (`live`: this thread's row exists; `g`: its place in the group)."""

    def __init__(self, program: Program, knobs, name: str, layout: Plan):
        super().__init__(program, "block", knobs, name)
        self.layout = layout

    def _runs(self, body: list[str]) -> list[str]:
        """`body` for each of this thread's elements: `c` its column, `v0` its value."""
        lay = self.layout
        return ["#pragma unroll", f"for (int q = 0; q < {lay.chunks}; ++q) {{",
                f"    const int64_t c0 = ((int64_t)q * {lay.group} + g) * {lay.vector};",
                "    if (live && c0 < cols) {", *indent("\n".join(body), 8).splitlines(), "    }", "}"]

    def _each(self, before: int, lines: list[str]) -> list[str]:
        return ["#pragma unroll", f"for (int e = 0; e < {self.layout.vector}; ++e) {{", "    const int64_t c = c0 + e;",
                f"    const float v0 = xv[q * {self.layout.vector} + e];",
                *indent(self.program.elements(before), 4).splitlines(), *("    " + line for line in lines), "}"]

    def _pass(self, before: int, init: list[str], update: str, simd: str | None = None) -> list[str]:
        return [*init, *self._runs(self._each(before, [update]))]

    def _reduce(self, value: str, init: str, op: str) -> str:
        if self.layout.block:
            return f"{self.name}_block_reduce({value}, {init}, shm, {op}())"
        return f"{self.name}_group_reduce<{self.layout.group}>({value}, {op}())"

    def _store(self, result: str) -> list[str]:
        if self.program.reduced:
            return [f"if (live && g == 0) out[row] = {result};"]
        vector, nodes = self.layout.vector, len(self.program.nodes)
        if vector == 1:
            return self._pass(nodes, [], f"out[row * cols + c] = {result};")
        store = "*reinterpret_cast<float4*>(out + row * cols + c0) = make_float4(o[0], o[1], o[2], o[3]);"
        return self._runs(["float o[4];", *self._each(nodes, [f"o[e] = {result};"]), store])

    def load(self) -> list[str]:
        """The row's elements into `xv` (zeros past its end)."""
        lay = self.layout
        if lay.vector == 4:
            read = ["const float4 t = *reinterpret_cast<const float4*>(xr + c0);",
                    "xv[q * 4] = t.x; xv[q * 4 + 1] = t.y; xv[q * 4 + 2] = t.z; xv[q * 4 + 3] = t.w;"]
        else:
            read = ["xv[q] = xr[c0];"]
        return [f"float xv[{lay.chunks * lay.vector}] = {{}};", *self._runs(read)]


KERNEL = """
{group_reduce}// The rows this kernel holds in registers ({plan}): one read of each row, one write.
__global__ void __launch_bounds__({threads}) {name}_registers_kernel(float* __restrict__ out,
        const float* __restrict__ x, int64_t rows, int64_t cols, FusedParams p) {{
{shared}    const int g = {g};
    for (int64_t first = {first}; first < rows; first += {step}) {{
        const int64_t row = first{offset};
        const bool live = row < rows;
        const float* xr = x + (live ? row : 0) * cols;
{row}
    }}
}}
"""

GROUP_REDUCE = """// `v` combined over each aligned group of G lanes; every lane of the group gets its group's result.
template <int G, class Op>
__device__ __forceinline__ float {name}_group_reduce(float v, Op op) {{
    for (int o = G / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}}

"""

LAUNCH = """    if (cols <= {capacity}{aligned}) {{
        const int64_t per_block = {per_block};
        int64_t blocks = (rows + per_block - 1) / per_block;
        if (blocks > 132 * 32) blocks = 132 * 32;
        {name}_registers_kernel<<<(unsigned)blocks, {threads}, 0, stream>>>(out, x, rows, cols, p);
        return;
    }}
"""


def kernel(program: Program, knobs, name: str, layout: Plan) -> str:
    code = RegisterRowCode(program, knobs, name, layout)
    body = indent("\n".join(code.load() + code.lines()), 8)
    threads, lay = layout.threads, layout
    if lay.block:
        shm = 32 if knobs.reduce == "warp" else threads
        where = dict(g="threadIdx.x", first="blockIdx.x", step="gridDim.x", offset="",
                     shared=f"    __shared__ float shm[{shm}];\n", group_reduce="")
    else:
        rows_per_warp = 32 // lay.group
        where = dict(g=f"threadIdx.x % {lay.group}", offset=f" + (threadIdx.x & 31) / {lay.group}", shared="",
                     first=f"((int64_t)blockIdx.x * {threads // 32} + threadIdx.x / 32) * {rows_per_warp}",
                     step=f"(int64_t)gridDim.x * {threads // 32 * rows_per_warp}",
                     group_reduce=GROUP_REDUCE.format(name=name))
    return KERNEL.format(name=name, threads=threads, row=body, **where,
                         plan=f"{lay.group} threads a row, {lay.chunks} x {lay.vector} elements each")


def launch(name: str, layout: Plan) -> str:
    aligned = (" && cols % 4 == 0 && ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out)) & 15) == 0"
               if layout.vector == 4 else "")
    per_block = 1 if layout.block else layout.threads // layout.group
    return LAUNCH.format(capacity=layout.capacity, aligned=aligned, per_block=per_block, name=name,
                         threads=layout.threads)
