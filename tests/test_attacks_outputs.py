"""White-box attacks through the memory a candidate returns (cpu backend, the trusted path): outputs the judge's own
copy would complete after the clock stopped, and output memory written again while its caller still holds it. Each
was a held-out red-team win (2026-12-05, docs/threat-model.md); each test fails without its defence."""

import textwrap

from conftest import fast_config
from cuda_agent.judge import Judge
from test_attacks import AFFINE

TILED = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return (torch.relu(x * self.scale + self.shift) * 0.5).unsqueeze(0).repeat(R, 1)


R = 64
N = 1 << 14


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return [2.0, 0.1]
"""
# a binding that writes into the row it is given
INTO = """
static torch::Tensor affine_relu_into(torch::Tensor x, torch::Tensor out, double scale, double shift) {
    TORCH_CHECK(x.is_contiguous() && out.is_contiguous() && out.sizes() == x.sizes(), "bad out");
    affine_relu_launcher(out.data_ptr<float>(), x.data_ptr<float>(), static_cast<float>(scale),
                         static_cast<float>(shift), x.numel(), 0);
    return out;
}

static void register_affine_relu(pybind11::module& m) {
    m.def("affine_relu_into", &affine_relu_into);"""
PAGES = '''import ctypes
import os

import torch
import torch.nn as nn

import cuda_extension

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]


class ModelNew(nn.Module):
    """Each input size's R rows are one row's pages mapped R times: a contiguous (R, n) tensor, one row written."""

    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale, self.shift, self.tiles = scale, shift, {}

    def forward(self, x):
        n = x.numel()
        if (n * 4) % 4096:  # (an odd extra shape: every row computed)
            out = torch.empty(64, n)
            for r in range(64):
                cuda_extension.affine_relu_into(x, out[r], self.scale, self.shift)
            return out
        if n not in self.tiles:
            row = n * 4
            fd = os.memfd_create("row", 0)
            os.ftruncate(fd, row)
            base = libc.mmap(None, 64 * row, 0, 0x22, -1, 0)
            for r in range(64):
                libc.mmap(base + r * row, row, 3, 0x11, fd, 0)  # MAP_SHARED | MAP_FIXED: the same row each time
            memory = (ctypes.c_char * (64 * row)).from_address(base)
            self.tiles[n] = (fd, memory, torch.frombuffer(memory, dtype=torch.float32).view(64, n))
        full = self.tiles[n][2]
        cuda_extension.affine_relu_into(x, full[0], self.scale, self.shift)
        return full
'''


def test_an_output_described_as_an_expanded_view_is_refused(cache_dir, tmp_path, make_workspace):
    """One row computed and returned as `expand(R, -1)` (stride 0): the judge's copy wrote the other rows after the
    clock stopped, and a 22 ms task was credited 1.5 ms, reward 3. A layout that overlaps itself where the
    reference's does not fails."""
    task = tmp_path / "tiled.py"
    task.write_text(TILED)
    ws = make_workspace()
    (ws / "model_new.py").write_text(textwrap.dedent("""\
        import torch.nn as nn

        import cuda_extension


        class ModelNew(nn.Module):
            def __init__(self, scale: float, shift: float):
                super().__init__()
                self.scale, self.shift = scale, shift

            def forward(self, x):
                return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0).unsqueeze(0).expand(64, -1)
        """))
    verdict = Judge("cpu", fast_config(cache_dir)).evaluate(task, ws)
    assert not verdict.correct and "overlaps itself (strides [0, 1]" in verdict.error, verdict.error


def test_an_output_whose_pages_are_one_row_mapped_many_times_is_refused(cache_dir, tmp_path, make_workspace):
    """The same with strides no layout check can fault (dense, contiguous): the repetition is in the page tables, one
    memfd row mapped at 64 consecutive addresses (reward 3 before, no finding). The pages behind every output are
    read from /proc/PID/maps: one mapped twice fails."""
    task = tmp_path / "tiled.py"
    task.write_text(TILED)
    ws = make_workspace(edits={"kernels/affine_relu_binding.cpp": [(
        "\nstatic void register_affine_relu(pybind11::module& m) {\n", INTO)]})
    (ws / "model_new.py").write_text(PAGES)
    verdict = Judge("cpu", fast_config(cache_dir)).evaluate(task, ws)
    assert not verdict.correct and "map one page of memory at two addresses" in verdict.error, verdict.error


def test_output_buffers_used_in_turn_while_the_caller_still_holds_them_fail(cpu_judge, make_workspace):
    """Two output buffers filled in turn passed the check that read one call back, and so did one buffer reused only
    after calls whose pause showed they were not read. The harness now keeps the outputs of the last two calls and
    the trusted side reads them again, at places it draws, after every call."""
    ws = make_workspace(edits={"kernels/affine_relu_binding.cpp": [(
        "    auto out = torch::empty_like(x);",
        "    static torch::Tensor ring[2];\n    static int turn = 0;\n    auto& out = ring[turn ^= 1];\n"
        "    if (!out.defined() || out.sizes() != x.sizes()) out = torch::empty_like(x);")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert not verdict.correct and "which its caller still holds, changed during this call" in verdict.error, \
        verdict.error
