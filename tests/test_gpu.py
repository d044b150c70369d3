"""GPU end to end (run on the device machine by scripts/gpu_check.sh; CI deselects the `gpu` marker)."""

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
