"""GPU end to end (run on the device machine by scripts/gpu_check.sh; CI deselects the `gpu` marker)."""

import json
from pathlib import Path

import pytest

from conftest import CANDIDATES, TASKS, fast_config

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


def test_cuda_workspace_is_built_verified_timed_and_rewarded(gpu_judge):
    verdict = gpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_cuda")
    assert verdict.compiled and verdict.correct, verdict.error
    assert verdict.reward >= 2, verdict.times_us
    assert any("affine_relu_kernel" in k for k in verdict.timing["candidate"]["kernels"])
    assert "H200" in verdict.device or verdict.device
    assert verdict.build["seconds"] < 60


def test_cuda_single_file_load_inline(gpu_judge):
    verdict = gpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_cuda_single.py")
    assert verdict.compiled and verdict.correct, verdict.error
    assert verdict.reward >= 1


def test_illegal_memory_access_fails_and_the_judge_survives(gpu_judge, make_workspace):
    ws = make_workspace("affine_relu_cuda", {KERNEL: [
        ("reinterpret_cast<float4*>(out)[i] = v;", "reinterpret_cast<float4*>(out)[i + (1LL << 40)] = v;")]})
    verdict = gpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and "illegal memory access" in verdict.error.lower(), verdict.error
    again = gpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_cuda")
    assert again.correct and again.reward >= 2, again.error


def test_work_on_a_side_stream_is_still_timed(gpu_judge, make_workspace):
    # The kernel runs on a pool stream the current stream never waits for: CUDA events on the current stream
    # would time it as free. (The device sync first makes it correct: the inputs are written on the current stream.)
    normal = gpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_cuda")
    ws = make_workspace("affine_relu_cuda", {BINDING: [
        ("c10::cuda::getCurrentCUDAStream().stream()",
         "(cudaDeviceSynchronize(), c10::cuda::getStreamFromPool().stream())")]})
    side = gpu_judge.evaluate(AFFINE, ws)
    assert side.correct, side.error
    assert side.times_us["candidate"] > 0.5 * normal.times_us["candidate"], (side.times_us, normal.times_us)


def test_nvcc_error_names_file_and_line(gpu_judge, make_workspace):
    ws = make_workspace("affine_relu_cuda", {KERNEL: [("v.x = fmaxf", "v.x = no_such_function")]})
    verdict = gpu_judge.evaluate(AFFINE, ws)
    assert not verdict.compiled and "kernels/affine_relu.cu(" in verdict.error, verdict.error


def test_outputs_cross_by_file_when_cuda_ipc_is_off(cache_dir):
    from cuda_agent.judge import Judge

    judge = Judge("cuda", fast_config(cache_dir, cuda_ipc=False))
    verdict = judge.evaluate(AFFINE, CANDIDATES / "affine_relu_cuda")
    assert verdict.correct and verdict.reward >= 2, verdict.error
    assert set(verdict.phases_s) >= {"build", "reference_ready", "candidate_load", "verify", "time_candidate"}


def test_the_candidate_runs_sandboxed_on_the_gpu(gpu_judge):
    verdict = gpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_cuda")
    assert verdict.correct, verdict.error
    assert verdict.sandbox.startswith("namespaces: user, net, pid, mount"), verdict.sandbox


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
    assert verdict.reward == -1 and "none of the candidate's own kernels ran" in verdict.error, verdict.error


def test_host_work_before_the_first_launch_fails(gpu_judge, make_workspace):
    # 2 ms of host work before the kernel: outside every device timeline, so it would look free.
    spin = "{ auto t0 = std::chrono::steady_clock::now(); while (std::chrono::steady_clock::now() - t0 < " \
           "std::chrono::milliseconds(2)) {} }\n    "
    ws = make_workspace("affine_relu_cuda", {KERNEL: [("#include <cstdint>", "#include <cstdint>\n#include <chrono>"),
                                                      (LAUNCH, spin + LAUNCH)]})
    verdict = gpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and verdict.error.startswith("host-side work"), verdict.error


PERSIST = """
import ctypes

_maps = open('/proc/self/maps').read().split()
_cudart = ctypes.CDLL(next(p for p in _maps if '/libcudart.so' in p))


def persisting_limit():
    value = ctypes.c_size_t(0)
    assert _cudart.cudaDeviceGetLimit(ctypes.byref(value), 6) == 0
    return value.value
"""


def test_persisting_l2_lines_are_reset_between_timed_calls(gpu_judge, make_workspace):
    # The candidate reserves persisting L2 in every call and checks it is gone at the next: the judge resets it
    # before each timed call, so the reservation (and any access-policy window) cannot carry over the flush.
    ws = make_workspace("affine_relu_cuda", {"model_new.py": [
        ("import cuda_extension\n", "import cuda_extension\n" + PERSIST),
        ("        return cuda_extension", "        self.calls = getattr(self, 'calls', 0) + 1\n"
         "        if 8 < self.calls < 20 and persisting_limit() != 0:  # calls 7-21 are timed, each after a flush\n"
         "            raise RuntimeError('persisting L2 survived from the previous call')\n"
         "        _cudart.cudaDeviceSetLimit(6, ctypes.c_size_t(4 << 20))\n"
         "        return cuda_extension")]})
    verdict = gpu_judge.evaluate(AFFINE, ws)
    assert verdict.correct, verdict.error


def test_kernel_hang_and_gpu_oom_are_verdicts_and_leave_nothing_behind(cache_dir, make_workspace, tmp_path):
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
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip().splitlines()
    apps = [line for line in apps if line.split(",")[0].strip() != str(__import__("os").getpid())]
    assert apps == [], f"GPU processes left behind: {apps}"


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
    assert summary["stop"] == "finish" and summary["final_verdict"]["reward"] >= 2, summary
    exported = gpu_judge.evaluate(AFFINE, Path(summary["best_single_file"]))
    assert exported.correct and exported.reward >= 1, exported.error
