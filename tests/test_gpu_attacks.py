"""White-box attacks on the GPU's trusted clock (run on the device machine by scripts/gpu_check.sh), written as a policy
that has read `judge/trusted/gpu_calls.py` would write them: the candidate's process cannot touch the clock, so they
go for what the clock shares with it: the GPU's scheduler (one context at a time, in time slices of ~2.1 ms) and the
clock's calibration. Each docstring names the defence; each test fails when it is removed (docs/threat-model.md).

The candidates are tests/data/candidates/affine_relu_cuda with a different model_new.py, on affine_relu at 2^24
elements (~26 us: far above the clock's resolution, so a gain would show); `torch.cuda._sleep` is a spin kernel
that no op audit sees.
"""

import textwrap

import pytest

from conftest import CANDIDATES, TASKS, fast_config

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

KERNEL = "cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)"
SPIN_CYCLES = 100_000_000  # ~50 ms at the H200's clock


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu-attacks") / "affine_relu_2e24.py"
    path.write_text((TASKS / "affine_relu.py").read_text().replace("N = 1 << 21", "N = 1 << 24"))
    return path


@pytest.fixture(scope="module")
def judge(cache_dir):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from cuda_agent.judge import Judge

    judge = Judge("cuda", fast_config(cache_dir, spare_candidates=0))
    if not judge.backend.trusted_clock:
        pytest.skip("attacks on the trusted clock (CUDA_AGENT_GPU_CLOCK=in-process chose the other)")
    yield judge
    judge.close()


def candidate(make_workspace, body: str, init: str = "", prelude: str = ""):
    """The CUDA workspace with a ModelNew whose __init__ runs `init` and whose forward is `body` (`x` the input; the
    honest kernel call is KERNEL); `prelude` runs at import."""
    ws = make_workspace("affine_relu_cuda")
    (ws / "model_new.py").write_text(
        "import torch\nimport torch.nn as nn\n\nimport cuda_extension\n\n" + textwrap.dedent(prelude)
        + "\n\nclass ModelNew(nn.Module):\n    def __init__(self, scale: float, shift: float):\n"
        "        super().__init__()\n        self.scale, self.shift = scale, shift\n"
        + textwrap.indent(textwrap.dedent(init), "        ")
        + "\n    def forward(self, x):\n" + textwrap.indent(textwrap.dedent(body), "        ") + "\n")
    return ws


def test_gpu_work_left_running_to_slow_the_baselines_credits_no_speed(judge, task, make_workspace):
    """Every call queues 50 ms of spinning on a stream of its own, which runs on while the process is stopped: the
    baseline callee's windows (eager's checks, baselines timed again) then wait for the candidate's time slices, and
    so would the empty calls the clock's overhead is taken from. The defence: empty windows that spread or lengthen
    mark the timing `gpu_shared`, which credits no speed, and the charged overhead is never more than calibrated."""
    honest = judge.evaluate(task, CANDIDATES / "affine_relu_cuda")
    ws = candidate(make_workspace, """
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(%d)
        return %s""" % (SPIN_CYCLES, KERNEL), init="self.side = torch.cuda.Stream()")
    verdict = judge.evaluate(task, ws)
    assert honest.correct and verdict.correct, (honest.error, verdict.error)
    assert verdict.reward <= min(honest.reward, 1), (verdict.times_us, honest.times_us, verdict.warnings)
    assert any("the GPU was shared" in w for w in verdict.warnings), verdict.warnings


def test_outputs_finished_after_done_on_another_stream_are_read_unfinished(judge, task, make_workspace):
    """The kernel queued on a stream of its own behind 50 ms of spinning, its output returned at once: `done` is
    written on the call's stream while the work has not begun, so the window is short. The defence: the outputs are
    copied by the trusted stream right after the window (work past the ~2.1 ms time slice is not finished by then),
    so the verification calls read what was there before."""
    ws = candidate(make_workspace, """
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(%d)
            return %s""" % (SPIN_CYCLES, KERNEL), init="self.side = torch.cuda.Stream()")
    verdict = judge.evaluate(task, ws)
    assert verdict.reward == -1 and verdict.error.startswith("incorrect"), verdict.error


def test_spinning_while_the_clock_is_calibrated_shortens_no_call(cache_dir, task, make_workspace, tmp_path):
    """Two seconds of spinning queued at import, while a fresh reference worker calibrates the clock on its first
    candidate: the calibration's empty windows then hold the candidate's time slices, and a larger overhead charged
    would shorten every call. The defence: a calibration that shows another context's work is taken again (up to
    three times) and flagged while it does, and calls are charged the smaller of it and the empty calls beside them."""
    from cuda_agent.judge import Judge

    fresh = tmp_path / "affine_relu_2e24_fresh.py"  # a task of its own: its reference worker starts cold
    fresh.write_text(task.read_text())
    judge = Judge("cuda", fast_config(cache_dir, spare_candidates=0))
    try:
        ws = candidate(make_workspace, "return " + KERNEL, prelude=f"""
            _side = torch.cuda.Stream()
            with torch.cuda.stream(_side):
                for _ in range(40):
                    torch.cuda._sleep({SPIN_CYCLES})
            """)
        verdict = judge.evaluate(fresh, ws)
        honest = judge.evaluate(fresh, CANDIDATES / "affine_relu_cuda")
    finally:
        judge.close()
    assert verdict.correct and honest.correct, (verdict.error, honest.error)
    noisy = any("the GPU was shared" in w for w in verdict.warnings)
    assert verdict.reward <= honest.reward, (verdict.times_us, honest.times_us, verdict.warnings)
    assert noisy or verdict.times_us["candidate"] >= 0.8 * honest.times_us["candidate"], (
        verdict.times_us, honest.times_us, verdict.timing["candidate"])
