"""GPU end to end (run on the device machine by scripts/gpu_check.sh; CI deselects the `gpu` marker)."""

import json
from pathlib import Path

import pytest

from conftest import (CANDIDATES, TASKS, fast_config, kept_processes, sampled_logprobs_are_the_trainer_s,
                      static_decoder_follows_the_model)

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

AFFINE = TASKS / "affine_relu.py"
KERNEL = "kernels/affine_relu.cu"
BINDING = "kernels/affine_relu_binding.cpp"


@pytest.fixture(scope="module")
def gpu_judge(cache_dir):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from cuda_agent.judge import Judge

    return Judge("cuda", fast_config(cache_dir))


def trusted(judge) -> bool:
    """Whether `judge` keeps the GPU clock on the trusted side (the default; `CUDA_AGENT_GPU_CLOCK=in-process` runs
    these tests on the candidate's own clock): no kernel timeline is then believed, and what the in-process clock had
    to catch cannot gain anything."""
    return judge.backend.trusted_clock


def test_cuda_workspace_is_built_verified_timed_and_rewarded(gpu_judge):
    verdict = gpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_cuda")
    assert verdict.compiled and verdict.correct, verdict.error
    assert verdict.reward >= 2, verdict.times_us
    assert trusted(gpu_judge) or any("affine_relu_kernel" in k for k in verdict.timing["candidate"]["kernels"])
    assert verdict.device == torch.cuda.get_device_name(0)
    assert verdict.build["seconds"] < 60
    assert verdict.timing["status"] == "ok" and verdict.timing["baselines"]["checked_calls"], verdict.timing
    assert "speed_of_light_us" in verdict.timing or "H200" not in verdict.device


def test_cuda_single_file_load_inline(gpu_judge):
    verdict = gpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_cuda_single.py")
    assert verdict.compiled and verdict.correct, verdict.error
    assert verdict.reward >= 1


def test_an_output_made_outside_the_pool_is_copied_in_and_a_background_thread_s_torch_is_still_caught(
        gpu_judge, cache_dir):
    """The output of `background_thread.py` is made on another thread, outside the output pool: it is copied into
    the pool, not failed with torch's nested-pool error as the candidate's (the forty-sixth session's differential
    found that); strict then fails the torch ops that thread ran, and the kernelbench policy passes it as KernelBench
    itself does (torch ops are allowed there; its op audit does not run, so no strict finding names them yet)."""
    from cuda_agent.judge import Judge

    strict = gpu_judge.evaluate(AFFINE, CANDIDATES / "background_thread.py")
    assert strict.reward == -1 and "mempool" not in str(strict.error), strict.error
    assert any("aten::" in v for v in strict.policy_violations), (strict.error, strict.policy_violations)
    with Judge("cuda", fast_config(cache_dir, policy="kernelbench")) as judge:
        loose = judge.evaluate(AFFINE, CANDIDATES / "background_thread.py")
    assert loose.correct and loose.reward >= 1, loose.error


@pytest.mark.parametrize("method", ["kernelbench", "kernelbench-v0.1"])
def test_kernelbench_s_timing_runs_beside_ours_on_the_gpu_for_a_workspace_and_a_load_inline_file(cache_dir, method):
    """Both kinds of candidate get KernelBench's CUDA-event timing in a second process; on a plain pointwise kernel
    its speedups agree with the judge's within a factor of 3 (methods differ: events and mean vs our median)."""
    from cuda_agent.judge import Judge

    with Judge("cuda", fast_config(cache_dir, policy="kernelbench", timing=method)) as judge:
        for cand in (CANDIDATES / "affine_relu_cuda", CANDIDATES / "affine_relu_cuda_single.py"):
            v = judge.evaluate(AFFINE, cand)
            kb = v.kernelbench_timing
            assert v.correct and not kb.get("error"), (v.error, kb)
            assert kb["method"] == method and kb["stats_ms"]["candidate"]["num_trials"] == 100, kb
            assert kb["compile_ms"] and not kb["compile_error"], kb
            # (our times, credited or not: a timing too noisy to credit still measured both; H200 2026-12-06)
            ours = v.times_us["eager"] / v.times_us["candidate"]
            assert 1 / 3 < kb["speedup_vs_eager"] / ours < 3, (kb, v.times_us, v.reason)


def test_a_single_file_built_for_an_older_gpu_gets_machine_code_for_this_one(gpu_judge, tmp_path):
    source = (CANDIDATES / "affine_relu_cuda_single.py").read_text()
    older = tmp_path / "older_gpu.py"
    older.write_text(source.replace('extra_cuda_cflags=["-O3"]', 'extra_cuda_cflags=["-O3", "-arch=sm_80"]')
                     .replace("affine_relu_cuda_inline", "affine_relu_sm80"))
    verdict = gpu_judge.evaluate(AFFINE, older)
    assert verdict.correct, verdict.error
    target = gpu_judge.backend.arch.rstrip("a")
    if target != "80":  # the driver would otherwise compile the PTX at every load, in every fresh sandbox
        assert f"-gencode=arch=compute_80,code=sm_{target}" in verdict.build["inline"][0]["log"]


def test_illegal_memory_access_fails_and_the_judge_survives(gpu_judge, make_workspace):
    ws = make_workspace("affine_relu_cuda", {KERNEL: [
        ("reinterpret_cast<float4*>(out)[i] = v;", "reinterpret_cast<float4*>(out)[i + (1LL << 40)] = v;")]})
    verdict = gpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and "illegal memory access" in verdict.error.lower(), verdict.error
    again = gpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_cuda")
    assert again.correct and again.reward >= 2, again.error


SLOW = ("const int64_t n4 = n / 4;", "const int64_t n4 = n / 4;\n    for (int r = 0; r < 1000; ++r) __nanosleep(1000);")


def test_work_on_a_side_stream_is_still_timed(gpu_judge, make_workspace):
    # A kernel of a millisecond or more (every thread sleeps 1 ms first) on a pool stream the current stream never
    # waits for: CUDA events on the current stream would time it as free. (The device sync first makes it correct:
    # the inputs are written on the current stream.)
    normal = gpu_judge.evaluate(AFFINE, make_workspace("affine_relu_cuda", {KERNEL: [SLOW]}))
    side = gpu_judge.evaluate(AFFINE, make_workspace("affine_relu_cuda", {KERNEL: [SLOW], BINDING: [
        ("c10::cuda::getCurrentCUDAStream().stream()",
         "(cudaDeviceSynchronize(), c10::cuda::getStreamFromPool().stream())")]}))
    assert normal.correct and side.correct, (normal.error, side.error)
    assert normal.times_us["candidate"] > 1000, normal.times_us
    assert trusted(gpu_judge) or any("affine_relu_kernel" in k for k in side.timing["candidate"]["kernels"])
    assert side.times_us["candidate"] > 0.8 * normal.times_us["candidate"], (side.times_us, normal.times_us)


def test_a_kernel_launched_by_a_thread_after_forward_returns_is_not_free(gpu_judge, make_workspace):
    # forward returns at once; a host thread it started launches the (1 ms) kernel afterwards. Either the judge fails
    # it (the kernel ran outside the timed calls, or the thread was still working) or it times the kernel.
    normal = gpu_judge.evaluate(AFFINE, make_workspace("affine_relu_cuda", {KERNEL: [SLOW]}))
    late = make_workspace("affine_relu_cuda", {KERNEL: [SLOW], BINDING: [
        ("#include <cuda_runtime.h>", "#include <cuda_runtime.h>\n#include <thread>"),
        ("    affine_relu_launcher(out.data_ptr<float>(), x.data_ptr<float>(), static_cast<float>(scale),\n"
         "                         static_cast<float>(shift), x.numel(), config, "
         "c10::cuda::getCurrentCUDAStream().stream());",
         "    float* o = out.data_ptr<float>();\n    const float* in = x.data_ptr<float>();\n"
         "    int64_t n = x.numel();\n"
         "    cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();\n"
         "    std::thread([=] { affine_relu_launcher(o, in, (float)scale, (float)shift, n, config, stream); })"
         ".detach();")]})
    verdict = gpu_judge.evaluate(AFFINE, late)
    timed_fairly = verdict.correct and verdict.times_us["candidate"] > 0.8 * normal.times_us["candidate"]
    assert verdict.reward == -1 or timed_fairly, (verdict.error, verdict.times_us, normal.times_us)


def test_a_kernel_launched_without_a_stream_after_a_torch_fill_is_ordered_as_on_the_default_stream(gpu_judge,
                                                                                                       tmp_path):
    """KernelBench's solutions often fill the output with torch (`torch::zeros_like`, on the current stream) and
    launch on the legacy default stream (`<<<grid, block>>>`): in KernelBench, and in a model run on the default
    stream, the kernel runs after the fill. The judge's calls run on the legacy default stream so it is so here too
    (with one of torch's streams the fill raced the kernel: found as "got 0" on public solutions, issue 33)."""
    single = tmp_path / "legacy_stream.py"
    text = (CANDIDATES / "affine_relu_cuda_single.py").read_text()
    for old, new in (("auto out = torch::empty_like(x);", "auto out = torch::zeros_like(x);"),
                     (", 0, c10::cuda::getCurrentCUDAStream()>>>", ">>>")):
        assert old in text
        text = text.replace(old, new)
    single.write_text(text)
    verdict = gpu_judge.evaluate(AFFINE, single)
    assert verdict.correct and verdict.reward >= 1, verdict.error


NO_AUDIT_SWITCH = ("        return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)",
                   "        from torch.utils._python_dispatch import _get_current_dispatch_mode\n"
                   "        if _get_current_dispatch_mode() is None:\n"
                   "            return torch.relu(x * self.scale + self.shift) * 0.5\n"
                   "        return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)")


def test_torch_kernels_in_the_timed_calls_fail(gpu_judge, make_workspace):
    # Honest under the op audit (verification), torch's own kernels when timed: the timeline shows ATen's kernels.
    verdict = gpu_judge.evaluate(AFFINE, make_workspace("affine_relu_cuda", {"model_new.py": [NO_AUDIT_SWITCH]}))
    if trusted(gpu_judge):  # every call is audited alike: the switch never flips, its own kernel runs throughout
        assert verdict.correct and not verdict.policy_violations, verdict.error
        return
    assert verdict.reward == -1 and "torch's kernel" in verdict.error and "timed calls" in verdict.error, \
        verdict.error


MATMUL_TASK = """import torch


class Model(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():  # positive: TF32's relative error stays inside the tolerance
    return [torch.rand(2048, 2048), torch.rand(2048, 2048)]


def get_init_inputs():
    return []
"""


def test_tf32_on_a_task_that_forbids_it_is_named_as_what_strict_would_fail(cache_dir, tmp_path):
    # TF32 switched on inside forward (torch ops allowed by the kernelbench policy): faster than fp32's peak allows
    # and with TF32's error against fp64, the signature of a precision downgrade. KernelBench's tolerance passes it;
    # the verdict names the precision check that the strict judge fails it on.
    from cuda_agent.judge import Judge

    task = tmp_path / "matmul.py"
    task.write_text(MATMUL_TASK)
    tf32 = tmp_path / "tf32.py"
    tf32.write_text("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, a, b):\n"
                    "        torch.backends.cuda.matmul.allow_tf32 = True\n        return a @ b\n")
    verdict = Judge("cuda", fast_config(cache_dir, policy="kernelbench")).evaluate(task, tf32)
    assert verdict.correct, verdict.error
    assert any(f.startswith("precision:") for f in verdict.strict_findings), verdict.strict_findings


def test_a_process_started_in_forward_fails_on_the_gpu(gpu_judge, tmp_path):
    forker = tmp_path / "forker.py"
    forker.write_text("import os\nimport torch\n\n\nclass ModelNew(torch.nn.Module):\n"
                      "    def __init__(self, scale, shift):\n        super().__init__()\n\n"
                      "    def forward(self, x):\n        return os.fork() or x.new_zeros(x.shape)\n")
    verdict = gpu_judge.evaluate(AFFINE, forker)
    assert verdict.reward == -1 and "SIGSYS" in verdict.error, verdict.error


FORGED_MARKER = """

from torch.autograd.profiler import record_function


class ModelNew(Model):
    calls = 0

    def forward(self, x):
        out = super().forward(x)
        torch.cuda.synchronize()
        with record_function(f"cuda_agent_iter_{ModelNew.calls}"):  # the harness's name, around nothing
            ModelNew.calls += 1
        return out
"""


def test_a_range_named_like_the_harness_call_markers_fails(cache_dir, tmp_path):
    # The range would replace its call's window: the call's kernels (torch's, allowed by this policy) would fall
    # outside every window, where torch's kernels are the harness's own (flush, inputs), and cost nothing.
    from cuda_agent.judge import Judge

    forged = tmp_path / "forged_marker.py"
    forged.write_text(AFFINE.read_text() + FORGED_MARKER)
    judge = Judge("cuda", fast_config(cache_dir, policy="kernelbench"))
    verdict = judge.evaluate(AFFINE, forged)
    if trusted(judge):  # ranges mean nothing to the trusted clock: torch's kernels are timed as eager's are
        assert verdict.correct and verdict.speedup_vs_eager < 1.5, (verdict.error, verdict.times_us)
        return
    assert verdict.reward == -1 and "call markers" in verdict.error, (verdict.error, verdict.times_us)


def test_nvcc_error_names_file_and_line(gpu_judge, make_workspace):
    ws = make_workspace("affine_relu_cuda", {KERNEL: [("v.x = fmaxf", "v.x = no_such_function")]})
    verdict = gpu_judge.evaluate(AFFINE, ws)
    assert not verdict.compiled and "kernels/affine_relu.cu(" in verdict.error, verdict.error


def test_an_nvcc_error_in_a_single_file_is_placed_on_its_own_line(gpu_judge, tmp_path):
    bad = tmp_path / "bad_cuda_single.py"
    bad.write_text((CANDIDATES / "affine_relu_cuda_single.py").read_text().replace("fmaxf(", "no_such_fmax(")
                   .replace("affine_relu_cuda_inline", "affine_relu_bad"))
    line = next(i for i, text in enumerate(bad.read_text().splitlines(), 1) if "no_such_fmax(" in text)
    verdict = gpu_judge.evaluate(AFFINE, bad)
    errors = verdict.build["inline"][0]["error"].splitlines()
    assert errors[0].startswith(f"bad_cuda_single.py line {line} (cuda_sources line ") and "error" in errors[0], errors
    assert "whole log:" in errors[-1] and not verdict.compiled


def test_outputs_cross_as_shared_gpu_memory_in_and_out_of_the_sandbox(cache_dir):
    from cuda_agent.judge import Judge

    for mode in ("required", "none"):
        judge = Judge("cuda", fast_config(cache_dir, sandbox=mode))
        verdict = judge.evaluate(AFFINE, CANDIDATES / "affine_relu_cuda")
        assert verdict.correct and verdict.reward >= 2, (mode, verdict.error)
        assert set(verdict.phases_s) >= {"build", "reference_ready", "candidate_load", "verify", "timing"}
        assert verdict.phases_s["verify" if trusted(judge) else "verify_compare"] < 1, verdict.phases_s
        judge.close()


def test_the_candidate_runs_sandboxed_on_the_gpu(gpu_judge, visible_dir, tmp_path):
    # Probes, not descriptions: a loopback server reachable from here, a folder writable from here.
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    outside = visible_dir / "gpu-outside.txt"
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import errno, json, socket\nimport torch\n\n\nclass ModelNew(torch.nn.Module):\n"
        "    def __init__(self, scale, shift):\n        super().__init__()\n\n    def forward(self, x):\n"
        "        r = {'net': socket.socket().connect_ex(('127.0.0.1', %d)), 'gpu': torch.cuda.is_available()}\n"
        "        try:\n            open(%r, 'w').write('x'); r['write'] = 'ok'\n"
        "        except OSError as exc:\n            r['write'] = errno.errorcode[exc.errno]\n"
        "        raise RuntimeError('P=' + json.dumps(r))\n" % (server.getsockname()[1], str(outside)))
    try:
        verdict = gpu_judge.evaluate(AFFINE, probe)
    finally:
        server.close()
    result = json.JSONDecoder().raw_decode(verdict.error.split("P=", 1)[1])[0]  # (then where it was raised)
    assert result["gpu"] is True and result["net"] != 0 and result["write"] == "EROFS", result
    assert not outside.exists()
    assert verdict.sandbox.startswith("namespaces: user, net, ipc, pid, mount"), verdict.sandbox


HOST_COMPUTE = """{
    float* h = (float*)malloc(n * sizeof(float));
    cudaMemcpyAsync(h, x, n * sizeof(float), cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    for (int64_t i = 0; i < n; ++i) h[i] = fmaxf(h[i] * scale + shift, 0.f) * 0.5f;
    cudaMemcpyAsync(out, h, n * sizeof(float), cudaMemcpyHostToDevice, stream);
    cudaStreamSynchronize(stream);
    free(h);
}"""
LAUNCH = "affine_relu_kernel<<<(unsigned)blocks, threads, 0, stream>>>(out, x, scale, shift, n);"


def test_a_decoy_kernel_that_never_runs_fails(gpu_judge, make_workspace):
    # The kernel is compiled but never launched: the host computes and copies the result over.
    ws = make_workspace("affine_relu_cuda", {KERNEL: [("#include <cstdint>", "#include <cstdint>\n#include <cstdlib>"),
                                                      (LAUNCH, HOST_COMPUTE)]})
    verdict = gpu_judge.evaluate(AFFINE, ws)
    if trusted(gpu_judge):  # the host reads the inputs only once they are written: inside the (late) window
        assert verdict.reward <= 1 and verdict.speedup_vs_eager < 1, (verdict.error, verdict.times_us)
        return
    assert verdict.reward == -1 and "none of the candidate's own kernels ran" in verdict.error, verdict.error


def test_host_work_before_the_first_launch_fails(gpu_judge, make_workspace):
    # 2 ms of host work before the kernel: outside every device timeline, so it would look free.
    spin = "{ auto t0 = std::chrono::steady_clock::now(); while (std::chrono::steady_clock::now() - t0 < " \
           "std::chrono::milliseconds(2)) {} }\n    "
    ws = make_workspace("affine_relu_cuda", {KERNEL: [("#include <cstdint>", "#include <cstdint>\n#include <chrono>"),
                                                      (LAUNCH, spin + LAUNCH)]})
    verdict = gpu_judge.evaluate(AFFINE, ws)
    if trusted(gpu_judge):  # before the window the inputs are not written yet: host work there can compute nothing
        assert verdict.correct, verdict.error
        return
    assert verdict.reward == -1 and verdict.error.startswith("host-side work"), verdict.error


PERSIST = """
import ctypes

_maps = open('/proc/self/maps').read().split()
_cudart = ctypes.CDLL(next(p for p in _maps if '/libcudart.so' in p))


def persisting_limit():
    value = ctypes.c_size_t(0)
    assert _cudart.cudaDeviceGetLimit(ctypes.byref(value), 6) == 0
    return value.value


def reserve_persisting_l2():
    rc = _cudart.cudaDeviceSetLimit(6, ctypes.c_size_t(4 << 20))
    if rc != 0 or persisting_limit() == 0:
        raise RuntimeError(f'could not reserve persisting L2 (cudaDeviceSetLimit returned {rc})')
"""


def test_persisting_l2_lines_are_reset_between_timed_calls(gpu_judge, make_workspace):
    # The candidate reserves persisting L2 in every call (and fails if it cannot) and checks that it is gone at the
    # next timed one: the judge resets it before each (calls 8 on are warm-up and timed: 5 trials, extra shape and
    # scaled inputs come first, and they flush nothing). On the trusted path the reset is the reference worker's, in
    # its own context, before every call: the candidate's context keeps its own limit, and must still be judged.
    check = "False" if trusted(gpu_judge) else "self.calls >= 8 and persisting_limit() != 0"
    ws = make_workspace("affine_relu_cuda", {"model_new.py": [
        ("import cuda_extension\n", "import cuda_extension\n" + PERSIST),
        ("        return cuda_extension", "        self.calls = getattr(self, 'calls', 0) + 1\n"
         f"        if {check}:\n"
         "            raise RuntimeError('persisting L2 survived from the previous call')\n"
         "        reserve_persisting_l2()\n"
         "        return cuda_extension")]})
    verdict = gpu_judge.evaluate(AFFINE, ws)
    assert verdict.correct, verdict.error


def test_kernel_hang_and_gpu_oom_are_verdicts_and_leave_nothing_behind(cache_dir, make_workspace, tmp_path,
                                                                       gpu_judge):
    import subprocess

    from cuda_agent.judge import Judge

    judge = Judge("cuda", fast_config(cache_dir, run_timeout_s=30))
    hang = make_workspace("affine_relu_cuda", {KERNEL: [
        ("const int64_t n4 = n / 4;", "const int64_t n4 = n / 4;\n    while (n > 0) { __nanosleep(1000); }")]})
    verdict = judge.evaluate(AFFINE, hang)
    assert verdict.reward == -1 and "timed out" in verdict.error, verdict.error
    oom = tmp_path / "oom.py"
    oom.write_text("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def __init__(self, scale, shift):\n"
                   "        super().__init__()\n\n    def forward(self, x):\n"
                   "        return torch.empty(1 << 46, dtype=torch.uint8, device='cuda')\n")
    verdict = judge.evaluate(AFFINE, oom)
    assert verdict.reward == -1 and "out of memory" in verdict.error.lower(), verdict.error
    again = judge.evaluate(AFFINE, CANDIDATES / "affine_relu_cuda")
    assert again.correct and again.reward >= 2, again.error

    def gpu_processes() -> set[str]:  # but this one's and the other judge's kept ones
        lines = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                               capture_output=True, text=True).stdout.split()
        return set(lines) - {str(__import__("os").getpid())} - kept_processes(gpu_judge)

    def described(pids: set[str]) -> str:
        def cmdline(pid: str) -> str:
            try:
                return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()[:300]
            except OSError:
                return "gone"
        return "; ".join(f"{pid}: {cmdline(pid)}" for pid in pids)

    left = gpu_processes() - kept_processes(judge)
    assert not left, f"candidates' GPU processes left: {described(left)}"  # none of the three evaluations'
    judge.close()
    assert gpu_processes() == set(), f"GPU processes left behind: {described(gpu_processes())}"


def test_a_scripted_agent_episode_writes_a_real_cuda_kernel(gpu_judge, tmp_path):
    """The loopback episode of tests/test_agent.py on the cuda backend: a real CUDA kernel, written with a bug,
    fixed after `verify`, profiled; then the exported single file passes the judge too."""
    from test_agent import EPISODE, ScriptedEndpoint

    from cuda_agent.agent import Environment, LoopConfig, OpenAIClient, run_episode

    ws = CANDIDATES / "affine_relu_cuda"
    files = {"kernels/affine_relu.cpp": (ws / KERNEL).read_text(), "kernels/affine_relu_binding.cpp":
             (ws / BINDING).read_text()}
    script = json.loads(json.dumps(EPISODE))
    for call in script[1]["tool_calls"]:
        args = json.loads(call["function"]["arguments"])
        if args["path"] == "kernels/affine_relu.cpp":
            args = {"path": KERNEL, "content": files["kernels/affine_relu.cpp"].replace(
                "v.w = fmaxf(v.w * scale + shift, 0.f) * 0.5f;", "v.w = fmaxf(v.w * scale + shift, 0.f) * 0.25f;")}
        elif args["path"] == "kernels/affine_relu_binding.cpp":
            args = {"path": BINDING, "content": files["kernels/affine_relu_binding.cpp"]}
        else:
            args = {"path": "model_new.py", "content": (ws / "model_new.py").read_text()}
        call["function"]["arguments"] = json.dumps(args)
    script[4]["tool_calls"][0]["function"]["arguments"] = json.dumps(
        {"path": KERNEL, "old": "v.w * scale + shift, 0.f) * 0.25f;", "new": "v.w * scale + shift, 0.f) * 0.5f;"})
    endpoint = ScriptedEndpoint(script)
    try:
        run_dir = tmp_path / "run"
        summary = run_episode(Environment(gpu_judge, run_dir), OpenAIClient("scripted", endpoint.url, max_retries=0),
                              AFFINE, run_dir, LoopConfig(max_turns=20))
    finally:
        endpoint.close()
    assert summary.stop == "finish" and summary.reward >= 2, summary
    exported = gpu_judge.evaluate(AFFINE, Path(summary.best_single_file))
    assert exported.correct and exported.reward >= 1, exported.error


def test_host_memory_of_a_gpu_candidate_is_bounded(cache_dir, tmp_path):
    from cuda_agent.judge import Judge

    judge = Judge("cuda", fast_config(cache_dir, memory_limit_gb=4))
    hog = tmp_path / "hog.py"
    hog.write_text("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def __init__(self, scale, shift):\n"
                   "        super().__init__()\n"
                   "        self.hog = torch.ones(8 << 30, dtype=torch.uint8, device='cpu')\n\n"
                   "    def forward(self, x):\n        return x * 1\n")
    verdict = judge.evaluate(AFFINE, hog)
    assert "cgroup" in verdict.sandbox, verdict.sandbox
    assert verdict.reward == -1 and "killed by the memory limit" in verdict.error, verdict.error


def test_the_pool_uses_every_gpu_one_device_phase_at_a_time_and_keeps_references_warm(cache_dir, make_workspace):
    from test_pool import CountingLock

    from cuda_agent.judge.pool import JudgePool

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    wrong = make_workspace("affine_relu_cuda", {KERNEL: [("0.f) * 0.5f;\n        v.y", "0.f) * 0.55f;\n        v.y")]})
    work = [(AFFINE, CANDIDATES / "affine_relu_cuda"), (AFFINE, wrong),
            (AFFINE, CANDIDATES / "affine_relu_cuda_single.py")] * 2
    devices = list(range(torch.cuda.device_count()))
    with JudgePool("cuda", fast_config(cache_dir), devices=devices, workers=4) as pool:
        locks = [CountingLock() for _ in pool.judges]
        for judge, lock in zip(pool.judges, locks):
            judge.device_lock = lock
        verdicts = [f.result() for f in [pool.submit(task, cand) for task, cand in work]]
        started = [len(judge.references.workers) for judge in pool.judges]
    assert [v.correct for v in verdicts] == [True, False, True] * 2, [v.error for v in verdicts]
    # never two timed runs on one device; only the verified ones are timed (verification holds the device shared)
    assert all(lock.most == 1 for lock in locks) and sum(lock.entries for lock in locks) == 4
    assert all(lock.entries for lock in locks) and started == [1] * len(devices)  # every GPU; one warm reference


def test_the_ordered_gpu_window_holds_a_sandboxed_callees_work_wherever_it_queues_it(tmp_path):
    """The cuda backend's trusted clock (`judge/wire/gpu_order.py`) attacked by a sandboxed callee that knows it
    (`benchmarks/gpu_clock_attacks.py`): the window minus its constant overhead is the work; work queued after
    `done` on another stream stays inside the window up to the GPU's time slice, and past it the work is
    unfinished when the window closes (so outputs read then are wrong); work before `go` never sees the call's
    inputs; a call with no GPU work in the window falls below the overhead (so it can be refused)."""
    import subprocess
    import sys

    out = tmp_path / "attacks.json"
    probe = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_clock_attacks.py"
    run = subprocess.run([sys.executable, str(probe), "--sandbox", "--calls", "15", "--cases", "empty", "honest",
                          "after_done", "before_go", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    window = {name: row["window_us_median"] for name, row in rows.items()
              if isinstance(row, dict) and "window_us_median" in row}
    overhead = window["honest 0us"]
    for work in (100, 1000):
        assert abs(window[f"honest {work}us"] - overhead - work) < 0.1 * work, window
        assert abs(window[f"after_done {work}us"] - window[f"honest {work}us"]) < 0.03 * work + 5, window
        assert rows[f"after_done {work}us"]["finished_by_e1"].startswith("10/"), rows
        assert rows[f"before_go {work}us"]["saw_this_calls_gen"].startswith("0/"), rows
        assert window[f"before_go {work}us"] < overhead - 100, window
    assert rows["after_done 10000us"]["finished_by_e1"].startswith("0/"), rows  # cut at the time slice
    assert window["empty 0us"] < overhead - 100, window


def test_the_trusted_gpu_clock_judges_and_times_a_real_kernel(cache_dir, make_workspace):
    """The cuda backend's trusted path (the default: inputs written, clock kept and outputs read by the reference
    worker, `judge/trusted/gpu_calls.py`): a real kernel verified and timed; a forward that waits
    for its own work is judged all the same (its window opens after a grace period)."""
    from cuda_agent.judge import Judge

    judge = Judge("cuda", fast_config(cache_dir, spare_candidates=0))
    if not trusted(judge):
        pytest.skip("CUDA_AGENT_GPU_CLOCK=in-process")
    try:
        verdict = judge.evaluate(AFFINE, CANDIDATES / "affine_relu_cuda")
        assert verdict.correct and verdict.reward >= 2, verdict.error
        stats = verdict.timing["candidate"]
        assert 150 < stats["clock_overhead_us"] < 600 and 0 < stats["median_us"] < 1000, stats
        assert stats["gpu_shared"] is None and stats["median_us"] >= stats["clock_resolution_us"], stats
        call = "return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)"
        waits = make_workspace("affine_relu_cuda", {"model_new.py": [(call, (
            "out = cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)\n"
            "        torch.cuda.synchronize()\n        return out"))]})
        verdict = judge.evaluate(AFFINE, waits)
        assert verdict.correct, verdict.error
    finally:
        judge.close()


@pytest.mark.parametrize("family,shape", [
    ("pointwise", "BATCH * 64, 32, 512"), ("softmax", "BATCH * 64, 16, 1024"), ("softmax", "BATCH * 64, 512, 32"),
    ("softmax", "BATCH * 64, 512, 16"), ("log_softmax", "BATCH * 64, 512, 37"), ("mean", "BATCH * 64, 16, 2048"),
    ("sum_dropped", "BATCH * 64, 64, 256"), ("layer_norm", "BATCH * 64, 16, 1024"),
    ("linear_softmax", "BATCH * 64, 16, 1024")],
    ids=["pointwise", "softmax", "softmax_rows_of_32", "softmax_rows_of_16", "log_softmax_odd_rows", "mean_long_rows",
         "sum_dropped", "layer_norm", "linear_softmax"])
def test_the_experts_cuda_kernels_are_judged_correct_with_every_knob_setting(gpu_judge, family, shape, tmp_path):
    """The expert's three families on the GPU: fast and slow knobs both correct (reward >= 1), the fast pointwise
    kernel at least as fast as eager, and on rows of 32 the fast knobs (rows held in registers, eight to a warp)
    faster than the slow ones (one block per row, read from memory in each pass). The shapes reach every register
    layout (rows of 16 and 32: several rows a warp; 37: one float at a time; 2,048: a block a row; outputs per
    element, per row kept and dropped) and the judge's extra shapes the streaming kernels they fall back to."""
    from test_expert import FAMILIES, task

    from cuda_agent.rl.expert.kernels import FAST, SLOW, workspace_files
    from cuda_agent.rl.expert.trace import trace

    reference = tmp_path / f"{family}.py"
    reference.write_text(task(*FAMILIES[family], shape=shape).replace("nn.Linear(37", "nn.Linear(1024").replace(
        "nn.LayerNorm(37)", "nn.LayerNorm(1024)"))
    program = trace(reference.read_text())
    times = {}
    for knobs in (FAST, SLOW):
        folder = tmp_path / f"ws_{knobs.threads}"
        for path, text in workspace_files(program, "cuda", knobs).items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(text)
        verdict = gpu_judge.evaluate(reference, folder)
        assert verdict.correct and verdict.reward >= 1, (knobs, verdict.error)
        times[knobs] = verdict.times_us["candidate"]
        if family == "pointwise" and knobs == FAST:
            assert verdict.reward >= 2, (verdict.times_us, verdict.warnings, verdict.timing)
    if shape.endswith(", 32"):
        assert times[FAST] < times[SLOW], times


def test_the_static_decoder_s_cuda_graph_replays_the_model_s_steps(tiny_llama):
    """The batch sampler's decode step captured as CUDA graphs (one per bucket of attended slots: here three)
    gives the model's own next-token logits, step after step, and a sampler using it the trainer's log-probs."""
    from cuda_agent.rl.batcher import BatchSampler
    from cuda_agent.rl.models import Actor
    from cuda_agent.rl.static_decode import SPLIT

    actor = Actor.load(tiny_llama, "cuda")
    static_decoder_follows_the_model(actor, "cuda", steps=40, atol=1e-4)
    static_decoder_follows_the_model(actor, "cuda", steps=600, atol=1e-4, bucket=SPLIT)
    sampler = BatchSampler(actor.model, pad_id=0, temperature=0.8, seed=3, weights=actor.decoding_weights)
    try:
        tokens, logprobs = sampler([5, 9, 11, 3], 30, {63})
    finally:
        sampler.close()
    sampled_logprobs_are_the_trainer_s(actor, [5, 9, 11, 3], tokens, logprobs, 0.8, atol=1e-3)


def test_a_cuda_kernel_exported_from_a_llama_mlp_runs_in_the_whole_model_by_check_model_and_kernelize(tmp_path):
    """Issue 34 on the GPU: benchmarks/drop_in_model.py's whole path (task new -> eval -> export -> check-model ->
    kernels' kernelize) on a small Llama with a cuBLAS + fused SiLU-and-multiply CUDA kernel."""
    import subprocess
    import sys

    ran = subprocess.run([sys.executable, "benchmarks/drop_in_model.py", "--layers", "2", "--hidden", "64",
                          "--intermediate", "128", "--heads", "4", "--kv-heads", "2", "--vocab", "128", "--tokens",
                          "16", "--work", tmp_path, "--out", tmp_path / "drop_in.json"],
                         capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[1])
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    result = json.loads((tmp_path / "drop_in.json").read_text())
    assert result["verdict"]["correct"] and result["verdict"]["reward"] >= 1, result["verdict"]
    assert result["kernelize"]["match"] and "outputs    match" in result["check_model"]
    assert (tmp_path / "exported" / "build").is_dir() and "cu" in next((tmp_path / "exported" / "build").iterdir()).name
