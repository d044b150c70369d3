"""White-box attacks held out by a red team (2026-12-06, after the caller's deadline came in): each test fails
without its defence (docs/threat-model.md)."""

import secrets

import pytest

from conftest import TASKS, fast_config
from cuda_agent.judge import Judge

FILL = '''import os

import torch
import torch.nn as nn

import cuda_extension

NAME = "NAME_HERE"


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale, self.shift = scale, shift
        self.calls = 0

    def forward(self, x):
        if self.calls == 0:  # 64 MiB taken at once on the disk of the folder it runs in (no write: fallocate)
            try:
                fd = os.open(NAME, os.O_CREAT | os.O_WRONLY, 0o600)
                try:
                    os.posix_fallocate(fd, 0, 64 << 20)
                finally:
                    os.close(fd)
            except OSError:
                pass
        self.calls += 1
        return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)
'''


def test_a_candidate_cannot_take_the_judge_s_disk(cache_dir, make_workspace):
    """Held out (red team, 2026-12-06): the candidate's own run folder, its working directory, was bound writable
    from the judge's disk (the cache's `runs/`), bounded only by RLIMIT_FSIZE (32 GiB a file, any number of files):
    `posix_fallocate` filled a 3 GiB cache file system in milliseconds (on a real disk: all of it, nothing charged
    to the candidate's memory cgroup), for as long as its evaluation lasted, while it was judged correct and fast;
    every evaluation and store write beside it then failed. Its folder is now only read: it writes in its private
    /tmp and /dev/shm, memory its cgroup bounds."""
    judge = Judge("cpu", fast_config(cache_dir, keep_run_dirs=True))
    if not judge.sandboxed:
        pytest.skip("no sandbox here")
    name = f"fill_{secrets.token_hex(6)}.bin"
    ws = make_workspace()
    (ws / "model_new.py").write_text(FILL.replace("NAME_HERE", name))
    try:
        v = judge.evaluate(TASKS / "affine_relu.py", ws)
    finally:
        judge.close()
    left = list((cache_dir / "runs").glob(f"*/candidate/{name}"))
    for path in left:
        path.unlink()
    assert v.correct, v.error
    assert not left, f"the candidate took {left[0].stat().st_blocks * 512 >> 20} MiB of the judge's disk"


MASKED_SCORES = '''import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Causal attention scores: q @ k^T / sqrt(d), the future masked with -inf (what a softmax reads)."""

    def forward(self, q, k):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        L = s.shape[-1]
        return s.masked_fill(torch.triu(torch.ones(L, L, dtype=torch.bool), 1), float("-inf"))


B, L, D = 2, 128, 32


def get_inputs():
    return [torch.randn(B, L, D), torch.randn(B, L, D)]


def get_init_inputs():
    return []
'''
SCORES_KERNEL = r'''#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

static inline float half_precision(float x) {  // 10 bits of mantissa kept (fp16's), fp32's range
    uint32_t b;
    std::memcpy(&b, &x, 4);
    b = (b + 0xFFF + ((b >> 13) & 1)) & 0xFFFFE000u;
    float y;
    std::memcpy(&y, &b, 4);
    return y;
}

extern "C" void scores_launcher(float* out, const float* q, const float* k, int64_t B, int64_t L, int64_t D,
                                int rounded) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < L; ++i)
            for (int64_t j = 0; j < L; ++j) {
                float* o = out + (b * L + i) * L + j;
                if (j > i) { *o = -std::numeric_limits<float>::infinity(); continue; }
                float acc = 0.f;
                for (int64_t d = 0; d < D; ++d) acc += q[(b * L + i) * D + d] * k[(b * L + j) * D + d];
                *o = rounded ? half_precision(acc * scale) : acc * scale;
            }
}
'''
SCORES_BINDING = r'''#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include "../binding_registry.h"

extern "C" void scores_launcher(float* out, const float* q, const float* k, int64_t B, int64_t L, int64_t D,
                                int rounded);

static torch::Tensor scores_forward(torch::Tensor q, torch::Tensor k, int rounded) {
    TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && q.dtype() == torch::kFloat32, "contiguous float32");
    auto out = torch::empty({q.size(0), q.size(1), q.size(1)}, q.options());
    scores_launcher(out.data_ptr<float>(), q.data_ptr<float>(), k.data_ptr<float>(), q.size(0), q.size(1), q.size(2),
                    rounded);
    return out;
}

static void register_scores(pybind11::module& m) { m.def("scores_forward", &scores_forward); }

REGISTER_BINDING(scores, register_scores);
'''
SCORES_MODEL = '''import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, q, k):
        return cuda_extension.scores_forward(q, k, ROUNDED)
'''


def scores_workspace(folder, rounded: bool):
    (folder / "kernels").mkdir(parents=True)
    (folder / "kernels" / "scores.cpp").write_text(SCORES_KERNEL)
    (folder / "kernels" / "scores_binding.cpp").write_text(SCORES_BINDING)
    (folder / "model_new.py").write_text(SCORES_MODEL.replace("ROUNDED", str(int(rounded))))
    return folder


def test_a_task_whose_one_output_holds_an_infinity_is_judged_not_aborted(cpu_judge, tmp_path):
    """Held out (red team, 2026-12-06): on a task whose one output holds an infinity (masked attention scores, the
    log of 0), the first checked timed call asked the fp64 outputs, a tensor, for its truth (`out64 or ...`): the
    reference worker died of it ("Boolean value of Tensor with more than one value is ambiguous"), twice, and every
    candidate, the exact one too, was -1 ("evaluation aborted")."""
    task = tmp_path / "masked_scores.py"
    task.write_text(MASKED_SCORES)
    v = cpu_judge.evaluate(task, scores_workspace(tmp_path / "exact", rounded=False))
    assert v.correct, v.error
    assert not any(w.startswith("judged twice") for w in v.warnings), v.warnings


def test_the_precision_rule_sees_past_the_reference_s_infinities(cpu_judge, tmp_path):
    """Held out (red team, 2026-12-06): where the reference holds an infinity, matched by the candidate, the errors
    against fp64 summed inf - inf: every call's error read NaN, `max` kept the NaN, the ratio was NaN and never above
    the limit: a kernel storing its scores at fp16's precision (1,434x fp32 eager's error, -1 on the same task masked
    with 0) was correct with no warning (on the GPU, a bf16 tensor-core GEMM passes as fp32 the same way). The
    matched infinities are now left out of the fp64 sums, as they are of the tolerance's."""
    task = tmp_path / "masked_scores.py"
    task.write_text(MASKED_SCORES)
    v = cpu_judge.evaluate(task, scores_workspace(tmp_path / "rounded", rounded=True))
    assert not v.correct and (v.error or "").startswith("precision: error vs fp64"), (v.error, v.error_vs_fp64)


SLOW_LOAD = '''import time

import torch.nn as nn

import cuda_extension

time.sleep(6.0)  # (a CPU spinner could run here and in __init__ as well: no device lock is held then)


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        time.sleep(6.0)
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)
'''


def test_loading_and_building_the_candidate_share_one_time_bound(cache_dir, make_workspace):
    """Held out (red team, 2026-12-06): the import of model_new.py and the construction of ModelNew each waited for
    the candidate a fresh `run_timeout_s + build_budget_s` (`serve_builds` set its deadline per step): 900 s each
    by default, 30 minutes of a candidate's process before its first call (twice for one that then crashes), where
    `--timeout` promises 300 s to load, verify and time. The two now share one bound."""
    judge = Judge("cpu", fast_config(cache_dir, run_timeout_s=10))
    judge.config.build_budget_s = 1.0  # (after the builder took its own budget from it: the workspace still builds)
    ws = make_workspace()
    (ws / "model_new.py").write_text(SLOW_LOAD)
    try:
        v = judge.evaluate(TASKS / "affine_relu.py", ws)
    finally:
        judge.close()
    assert not v.correct and "timed out" in (v.error or ""), (v.error, v.phases_s)
    assert "verify" not in v.phases_s, v.phases_s


ARROW = '''import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.nn as nn

import cuda_extension  # (built, never called)

F32 = pa.float32()


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale, self.shift = pa.scalar(scale, F32), pa.scalar(shift, F32)
        self.zero, self.half = pa.scalar(0.0, F32), pa.scalar(0.5, F32)

    def forward(self, x):
        n = x.numel()
        arr = pa.Array.from_buffers(F32, n, [None, pa.foreign_buffer(x.data_ptr(), n * 4, base=x)])
        y = pc.multiply(pc.max_element_wise(pc.add(pc.multiply(arr, self.scale), self.shift), self.zero), self.half)
        return torch.frombuffer(y.buffers()[1], dtype=torch.float32, count=n).view(x.shape)
'''


def test_a_library_of_the_installation_outside_the_hidden_list_cannot_compute_for_a_strict_candidate(
        cpu_judge, make_workspace):
    """Held out (red team, 2026-12-06): numpy, scipy, numba... are hidden from a strict candidate because their
    compute is invisible to torch's op audit; pyarrow, installed beside them, was not: Arrow's compute kernels over
    the input's memory (`foreign_buffer` in, `torch.frombuffer` out, no dispatcher op either way) were judged
    correct under strict, no violation, with no kernel of the candidate's own (reward 1; 2 or 3 wherever Arrow's
    kernel beats eager). pyarrow, pandas, polars, duckdb and Pillow are hidden now too."""
    pytest.importorskip("pyarrow")
    if not cpu_judge.sandboxed:
        pytest.skip("no sandbox here")
    ws = make_workspace()
    (ws / "model_new.py").write_text(ARROW)
    v = cpu_judge.evaluate(TASKS / "affine_relu.py", ws)
    assert not v.correct and v.reward == -1, (v.reward, v.error, v.policy_violations)


AOTI = '''import os
import tempfile

import torch
import torch.nn as nn

import cuda_extension  # (built, never called)

torch._inductor.config.compile_threads = 1  # (no compile workers left running)


class _Affine(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return torch.relu(x * self.scale + self.shift) * 0.5


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        with torch.no_grad():
            program = torch.export.export(_Affine(scale, shift), (torch.randn(1 << 12),),
                                          dynamic_shapes={"x": {0: torch.export.Dim("n", min=2)}})
            path = torch._inductor.aoti_compile_and_package(
                program, package_path=os.path.join(tempfile.mkdtemp(), "affine.pt2"))
        self.runner = torch._inductor.aoti_load_package(path)

    def forward(self, x):
        return self.runner(x)
'''


def test_torch_s_own_compiler_run_from_the_candidate_s_process_is_not_its_kernel(cpu_judge, make_workspace):
    """Held out (red team, 2026-12-06): processes were allowed while the candidate loaded (only those left running
    failed it), so `ModelNew.__init__` ran torch.export and AOTInductor, whose g++ built a fused C++ library of the
    reference's own computation; `forward` ran it through AOTInductor's runner, which dispatches no torch op but
    the allocation of its output: correct under strict, no violation, at torch.compile's speed (1,472 us against
    its 1,479 and eager's 2,543: reward 2), no kernel of the candidate's. Under strict a process is now refused
    from before the candidate's import (EPERM; fatal once ModelNew is built): native code comes only through the
    judge's own builds."""
    ws = make_workspace()
    (ws / "model_new.py").write_text(AOTI)
    v = cpu_judge.evaluate(TASKS / "affine_relu.py", ws)
    assert not v.correct and v.reward == -1, (v.reward, v.error, v.times_us)


NNC = '''import torch
import torch.nn as nn

import cuda_extension  # (built, never called)

torch._C._jit_override_can_fuse_on_cpu(True)
torch._C._jit_set_texpr_fuser_enabled(True)
torch._C._jit_set_te_must_use_llvm_cpu(False)  # (NNC's own evaluator where torch has no LLVM)
torch._C._jit_set_fusion_strategy([("DYNAMIC", 20)])


@torch.jit.script
def affine_relu(x, scale: float, shift: float):
    return torch.relu(x * scale + shift) * 0.5


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale, self.shift = scale, shift
        with torch.no_grad():  # fused now, while no audit runs
            for n in (1 << 12, 2049, 1234, 1 << 12):
                affine_relu(torch.randn(n), scale, shift)

    def forward(self, x):
        return affine_relu(x, self.scale, self.shift)
'''


def test_torchscript_s_fuser_is_torch_compute_under_strict(cpu_judge, make_workspace, tmp_path):
    """Held out (red team, 2026-12-06): `torch.jit.script` with the tensor-expression fuser (NNC), warmed up in
    `__init__`, ran the whole computation as one fused kernel of NNC's (`fused_mul_add_relu_mul`; on the GPU a CUDA
    kernel NVRTC compiles in-process, not named `at::...`): the op audit's dispatch mode saw only the output's
    `empty_strided` and the all-threads profiler looked at `aten::` events only: correct under strict, no
    violation. The profiler's TorchScript fusion events are violations now."""
    task = tmp_path / "affine_small.py"
    task.write_text((TASKS / "affine_relu.py").read_text().replace("N = 1 << 21", "N = 1 << 12"))
    ws = make_workspace()
    (ws / "model_new.py").write_text(NNC)
    v = cpu_judge.evaluate(task, ws)
    assert not v.correct and v.reward == -1, (v.reward, v.error)
    assert "crashed" in (v.error or "") or "TorchScript fusion kernel" in (v.error or ""), v.error


ONEDNN = '''import torch
import torch.nn as nn
from torch.utils._python_dispatch import _pop_mode_temporarily

import cuda_extension  # (built, never called)


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.w, self.b = torch.tensor([[0.5 * scale]]), torch.tensor([0.5 * shift])

    def forward(self, x):
        with _pop_mode_temporarily():  # relu(x * s + b) * 0.5 as oneDNN's linear + ReLU of an N x 1 matrix
            y = torch.ops.mkldnn._linear_pointwise(x.view(-1, 1), self.w, self.b, "relu", [], "")
        return y.view(x.shape)
'''


def test_torch_ops_of_any_namespace_are_torch_compute_under_strict(cpu_judge, make_workspace):
    """Held out (red team, 2026-12-06): with the op audit's dispatch mode popped (the all-threads profiler is the line
    behind it), an op outside `aten::` computed the whole task: `mkldnn::_linear_pointwise` (oneDNN's fused linear +
    ReLU; + GELU on a 512 x 1024 linear_gelu: 7.5-10.3 ms against eager's 16-27 and torch.compile's 16, timings too
    noisy here to credit) was correct under strict, no violation: the profiler's audit looked at `aten::` events
    only. The trusted CPU sampler finds it (oneDNN's code, generated at run time, is foreign). (The red team's
    in-process rule, any other namespace's op a violation, is not taken: a candidate's own `TORCH_LIBRARY` ops have
    a namespace of their own.)"""
    if not cpu_judge.sandboxed:
        pytest.skip("no sandbox here")
    ws = make_workspace()
    (ws / "model_new.py").write_text(ONEDNN)
    v = cpu_judge.evaluate(TASKS / "affine_relu.py", ws)
    # (the in-process audit names the op first since the sampler could be dodged: see the next test)
    assert not v.correct and (v.error or "").startswith(("policy violation: torch compute: ",
                                                         "policy violation: torch op mkldnn::")), (v.reward, v.error)


DODGE = '''import time

import torch
import torch.nn as nn
from torch.utils._python_dispatch import _pop_mode_temporarily

import cuda_extension

# (5 gaps: the old sampler's 50 us cadence. At 3 the tests' 250 us sampler and a noisy machine fired it in some calls
# only, its own kernel there and oneDNN elsewhere: a mix, reward 1 in CI and here, 2026-12-08: threat-model.md)
PROBE_NS, GAP_NS, WATCHED = 300_000, 1_500, 5


def watched() -> bool:  # the sampler's interrupts (every 50 us of CPU time) as gaps in a 300 us spin
    clock = time.perf_counter_ns
    end = clock() + PROBE_NS
    last, gaps = clock(), 0
    while last < end:
        now = clock()
        if now - last > GAP_NS:
            gaps += 1
        last = now
    return gaps >= WATCHED


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale, self.shift = scale, shift
        self.w, self.b = torch.tensor([[0.5 * scale]]), torch.tensor([0.5 * shift])

    def forward(self, x):
        if watched():
            return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)
        with _pop_mode_temporarily():
            y = torch.ops.mkldnn._linear_pointwise(x.view(-1, 1), self.w, self.b, "relu", [], "")
        return y.view(x.shape)
'''


def test_torch_compute_only_where_the_sampler_does_not_watch_is_still_seen(cpu_judge, make_workspace):
    """Held out (red team E, 2026-12-06, on 7ea8c9f): the trusted CPU sampler watches the verification calls and 12
    extra untimed calls, never a timed one, and its task-clock interrupts (every 50 us of a thread's CPU time) show
    in a 300 us spin at the start of a call as gaps of microseconds at that cadence. The candidate ran its own kernel
    where it saw them (31 sampled calls: 7% foreign) and oneDNN's `mkldnn::_linear_pointwise`, dispatch mode popped,
    in the timed calls: correct under strict, no violation (the same candidate always on oneDNN: -1 from the
    sampler, 100% foreign). The in-process audit now counts torch's ops of every namespace (a second line; the
    sampler's own blind spot, the unwatched timed calls, stays)."""
    if not cpu_judge.sandboxed:
        pytest.skip("no sandbox here")
    ws = make_workspace()
    (ws / "model_new.py").write_text(DODGE)
    v = cpu_judge.evaluate(TASKS / "affine_relu.py", ws)
    assert not v.correct and v.reward == -1, (v.reward, v.error, (v.timing.get("candidate") or {}).get("cpu_samples"))
