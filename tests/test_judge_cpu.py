"""End to end on the CPU backend: build, verify, audit, time and reward real candidates."""

import pytest

from conftest import CANDIDATES, TASKS, fast_config
from cuda_agent.judge import Judge
from cuda_agent.task import TaskError

AFFINE = TASKS / "affine_relu.py"
KERNEL = "kernels/affine_relu.cpp"
BINDING = "kernels/affine_relu_binding.cpp"
STORE = "out[i] = std::max(x[i] * scale + shift, 0.f) * 0.5f;"


def assert_judge_still_works(judge: Judge, workspace) -> None:
    verdict = judge.evaluate(AFFINE, workspace)
    assert verdict.correct and verdict.reward >= 1, verdict.error


def test_correct_faster_workspace_earns_reward_2_or_more(cpu_judge):
    verdict = cpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
    assert verdict.compiled and verdict.correct, verdict.error
    assert verdict.reward >= 2
    assert verdict.error is None and verdict.policy_violations == []
    assert verdict.speedup_vs_eager > 1.05
    assert verdict.times_us["candidate"] > 0 and verdict.times_us["eager"] > 0 and verdict.times_us["compile"] > 0
    assert verdict.max_abs_error < 1e-5
    assert verdict.error_vs_fp64["candidate"] is not None and verdict.error_vs_fp64["ratio"] < 10
    assert verdict.backend == "cpu" and verdict.torch_version
    assert verdict.precision["float32_matmul_precision"] == "highest"
    assert len(verdict.seeds) == 5


def test_speed_of_light_bound_is_reported_and_beating_it_is_flagged(cache_dir):
    honest = Judge("cpu", fast_config(cache_dir, device_peaks=(1e15, 1e18))).evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
    assert honest.correct and 0 < honest.timing["speed_of_light_us"] < honest.times_us["candidate"]
    assert not any("speed of light" in w for w in honest.warnings)
    assert honest.timing["work"] == {"flops": 0, "bytes": 2 * 4 * (1 << 21)}  # elementwise: no matmul FLOPs
    # With a made-up 1 GB/s device, 16 MB of inputs and outputs take 16 ms: any real time "beats" it.
    slow = Judge("cpu", fast_config(cache_dir, device_peaks=(1e9, 1e12))).evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
    assert any("faster than the speed of light" in w for w in slow.warnings), slow.warnings


def test_baselines_are_cached_and_unchanged_files_are_not_recompiled(cpu_judge):
    first = cpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
    second = cpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
    assert second.timing["baseline_cached"] is True
    assert second.times_us["eager"] == first.times_us["eager"]
    assert second.times_us["compile"] == first.times_us["compile"]
    assert all(step["cached"] for step in second.build["steps"] if step["source"] != "<link>")
    assert first.seeds != second.seeds  # fresh inputs every evaluation


def test_wrong_result_gets_minus_one(cpu_judge, make_workspace):
    ws = make_workspace(edits={KERNEL: [(STORE, STORE.replace("0.5f", "0.55f"))]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and verdict.compiled and not verdict.correct
    assert verdict.error.startswith("incorrect:") and "outside atol" in verdict.error
    assert_judge_still_works(cpu_judge, CANDIDATES / "affine_relu_ok")


def test_torch_compute_in_cxx_binding_is_caught_by_source_scan(cpu_judge, make_workspace):
    ws = make_workspace(edits={BINDING: [("return out;", "return torch::relu(x * scale + shift) * 0.5;")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1
    assert any("torch::relu" in v for v in verdict.policy_violations), verdict.policy_violations
    assert "policy violation" in verdict.error


def test_torch_compute_hidden_from_the_scan_is_caught_at_run_time(cpu_judge, make_workspace):
    # Tensor methods called from C++ are invisible to a text scan; the dispatcher audit still sees them.
    ws = make_workspace(edits={BINDING: [("return out;", "return x.mul(scale).add(shift).clamp_min(0).mul(0.5);")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and verdict.compiled
    assert any("aten::clamp_min" in v for v in verdict.policy_violations), verdict.policy_violations
    assert_judge_still_works(cpu_judge, CANDIDATES / "affine_relu_ok")


def test_torch_compute_in_python_forward_is_caught(cpu_judge, make_workspace):
    ws = make_workspace(edits={"model_new.py": [
        ("return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)",
         "return torch.relu(cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0))")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1
    assert any("aten::relu" in v for v in verdict.policy_violations)


def test_torch_compute_in_a_background_thread_is_caught(cpu_judge):
    verdict = cpu_judge.evaluate(AFFINE, CANDIDATES / "background_thread.py")
    assert verdict.reward == -1
    assert any("background thread" in v and "aten::mul" in v for v in verdict.policy_violations), \
        verdict.policy_violations


BF16_STORE = ("uint32_t u; std::memcpy(&u, &x[i], 4); u &= 0xFFFF0000u; float v; std::memcpy(&v, &u, 4);\n"
              "        out[i] = std::max(v * scale + shift, 0.f) * 0.5f;")


def test_lower_precision_is_flagged_and_fails_in_strict_mode(cache_dir, cpu_judge, make_workspace):
    # Inputs truncated to bf16 inside the kernel: within atol=rtol=1e-2, but far from fp32 eager's own error.
    ws = make_workspace(edits={KERNEL: [("#include <cstdint>", "#include <cstdint>\n#include <cstring>"),
                                        (STORE, BF16_STORE)]})
    lenient = cpu_judge.evaluate(AFFINE, ws)
    assert lenient.correct, lenient.error
    assert lenient.error_vs_fp64["ratio"] > 1000 and any("precision" in w for w in lenient.warnings)
    strict = Judge("cpu", fast_config(cache_dir, max_error_ratio=100.0)).evaluate(AFFINE, ws)
    assert strict.reward == -1 and strict.error.startswith("precision:"), strict.error


def test_outputs_cached_across_calls_are_caught_by_the_recheck_after_timing(cpu_judge, make_workspace):
    # Keyed on the input object (kept alive, so no key is ever reused): every verification input set misses and
    # computes, the timing loop hits; fresh values written into the timed buffers expose the stale output.
    ws = make_workspace(edits={"model_new.py": [
        ("        return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)",
         "        key = (id(x), x.data_ptr())\n"
         "        if key not in self.cache:\n"
         "            self.cache[key] = (x, cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0))\n"
         "        return self.cache[key][1]"),
        ("        self.shift = shift\n", "        self.shift = shift\n        self.cache = {}\n")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and "re-check after timing" in verdict.error, verdict.error


def test_hard_coded_sizes_fail_the_extra_shape_check(cache_dir, cpu_judge, make_workspace):
    # Only whole blocks of 1024 elements are computed: right at the task's N = 2^21, wrong at the extra N = 2^20 + 1.
    ws = make_workspace(edits={BINDING: [("auto out = torch::empty_like(x);",
                                          "auto out = torch::empty_like(x);\n    out.fill_(123.f);"),
                                         ("static_cast<float>(shift), x.numel(), config)",
                                          "static_cast<float>(shift), x.numel() / 1024 * 1024, config)")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and "extra shape (N=1048577)" in verdict.error, verdict.error
    lenient = Judge("cpu", fast_config(cache_dir, extra_shapes=False)).evaluate(AFFINE, ws)
    assert lenient.correct, lenient.error


def test_segfault_is_a_failure_verdict_and_the_judge_survives(cpu_judge, make_workspace):
    ws = make_workspace(edits={KERNEL: [("(void)config;", "(void)config; volatile float* p = nullptr; *p = 1.f;")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and not verdict.correct
    assert "SIGSEGV" in verdict.error
    assert_judge_still_works(cpu_judge, CANDIDATES / "affine_relu_ok")


def test_hang_is_killed_at_the_timeout(cache_dir, make_workspace):
    judge = Judge("cpu", fast_config(cache_dir, run_timeout_s=20))
    ws = make_workspace(edits={KERNEL: [("(void)config;", "(void)config; volatile int spin = 1; while (spin) {}")]})
    verdict = judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and "timed out" in verdict.error
    assert verdict.seconds < 120
    assert_judge_still_works(judge, CANDIDATES / "affine_relu_ok")


def test_compile_error_reports_file_and_line(cpu_judge, make_workspace):
    ws = make_workspace(edits={KERNEL: [(STORE, "out[i] = undefined_symbol;")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and not verdict.compiled
    assert "kernels/affine_relu.cpp:" in verdict.error and "undefined_symbol" in verdict.error


def test_infrastructure_files_come_from_the_judge_not_the_candidate(cpu_judge, make_workspace):
    ws = make_workspace()
    (ws / "binding.cpp").write_text("#error the candidate's binding.cpp must never be compiled\n")
    (ws / "binding_registry.h").write_text("#error nor its registry header\n")
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.compiled and verdict.correct, verdict.error


def test_single_file_load_inline_candidate(cpu_judge):
    verdict = cpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_single.py")
    assert verdict.compiled and verdict.correct, verdict.error
    assert verdict.reward >= 1
    assert verdict.candidate["kind"] == "single_file"


def python_candidate(folder, init_args: str, init_body: str, forward_body: str):
    """A single-file candidate whose ModelNew is plain Python (for checks that need no kernel)."""
    path = folder / "model_new_py.py"
    path.write_text(f"import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def __init__(self, {init_args}):\n"
                    f"        super().__init__()\n        {init_body}\n\n    def forward(self, x):\n"
                    f"        return {forward_body}\n")
    return path


def test_state_dict_must_load_strictly(cpu_judge, tmp_path):
    renamed = python_candidate(tmp_path, "features", "self.proj = torch.nn.Linear(features, features)", "x")
    verdict = cpu_judge.evaluate(TASKS / "linear_gelu.py", renamed)
    assert verdict.reward == -1 and "state dict" in verdict.error


def test_output_aliasing_an_input_fails(cpu_judge, tmp_path):
    verdict = cpu_judge.evaluate(AFFINE, python_candidate(tmp_path, "scale, shift", "pass", "x.view(-1)"))
    assert verdict.reward == -1 and "aliases an input" in verdict.error


def test_input_mutation_fails(cpu_judge, make_workspace):
    ws = make_workspace(edits={BINDING: [
        ("return out;", "x.data_ptr<float>()[0] = 12345.f;\n    return out;")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and "modified in place" in verdict.error


@pytest.mark.parametrize("init_body, forward_body, message", [
    ("self.cls = type('Lazy', (torch.Tensor,), {})", "torch.Tensor._make_subclass(self.cls, x.new_zeros(x.shape))",
     "is a Lazy, not a plain torch.Tensor"),
    ("self.cls = type('Proxy', (), {'__eq__': lambda a, b: True})", "self.cls()", "is a Proxy, not a tensor"),
])
def test_proxy_outputs_are_rejected(cpu_judge, tmp_path, init_body, forward_body, message):
    verdict = cpu_judge.evaluate(AFFINE, python_candidate(tmp_path, "scale, shift", init_body, forward_body))
    assert verdict.reward == -1 and message in verdict.error, verdict.error


def test_exiting_the_process_is_a_failure_verdict(cpu_judge, tmp_path):
    quitter = python_candidate(tmp_path, "scale, shift", "import os; self.exit = os._exit", "self.exit(0)")
    verdict = cpu_judge.evaluate(AFFINE, quitter)
    assert verdict.reward == -1 and "exited with code 0" in verdict.error, verdict.error


def test_megabytes_of_output_are_capped_and_do_not_stall_the_judge(cpu_judge, tmp_path):
    chatty = python_candidate(tmp_path, "scale, shift", "import sys; self.err = sys.stderr",
                              "(print('x' * (1 << 20)), self.err.write('y' * (1 << 20)), x.new_zeros(x.shape))[2]")
    verdict = cpu_judge.evaluate(AFFINE, chatty)  # 10 MB printed across the trials
    assert verdict.reward == -1 and verdict.error.startswith("incorrect"), verdict.error
    assert verdict.seconds < 60


def test_out_of_memory_is_a_failure_verdict(cpu_judge, tmp_path):
    greedy = python_candidate(tmp_path, "scale, shift", "pass", "torch.empty(1 << 50, dtype=torch.float32)")
    verdict = cpu_judge.evaluate(AFFINE, greedy)
    assert verdict.reward == -1 and "ModelNew.forward failed" in verdict.error
    assert "alloc" in verdict.error.lower() or "memory" in verdict.error.lower(), verdict.error


@pytest.mark.parametrize("name, message", [
    ("no_model.py", "missing Model"),
    ("import_error.py", "importing the reference failed: ModuleNotFoundError"),
    ("bad_inputs.py", "get_inputs() failed: RuntimeError: this reference cannot make inputs"),
])
def test_broken_reference_is_a_clear_task_error(cpu_judge, name, message):
    with pytest.raises(TaskError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cpu_judge.evaluate(TASKS / "broken" / name, CANDIDATES / "affine_relu_ok")


@pytest.mark.parametrize("where, patch, replaced", [
    ("import", "import time\ntime.perf_counter = lambda: 0.0", "time.perf_counter"),
    ("import", "torch.cuda.synchronize = lambda *a: None", "torch.cuda.synchronize"),
    # From inside forward, during the timing loop: the fingerprint of the inputs the judge checks for mutation.
    ("forward", "import sys; sys.modules['__main__'].checksum = lambda *a: []", "__main__.checksum"),
    ("forward", "torch.Tensor.copy_ = lambda self, src, *a: self", "torch.Tensor.copy_ (added)"),
])
def test_replacing_the_harness_functions_is_caught(cpu_judge, make_workspace, where, patch, replaced):
    if where == "import":
        edit = ("import torch\n", f"import torch\n{patch}\n")
    else:  # the 8th call is inside the timing loop (after 5 trials and the extra shape)
        indented = patch.replace("\n", "\n            ")
        edit = ("    def forward(self, x):\n",
                "    def forward(self, x):\n        self.calls = getattr(self, 'calls', 0) + 1\n"
                f"        if self.calls == 8:\n            {indented}\n")
    verdict = cpu_judge.evaluate(AFFINE, make_workspace(edits={"model_new.py": [edit]}))
    assert verdict.reward == -1 and "replaced functions the judge relies on" in verdict.error, verdict.error
    assert replaced in verdict.error, verdict.error


def test_a_closed_form_for_the_input_distribution_fails_on_scaled_inputs(cache_dir, cpu_judge, tmp_path):
    # Every row mean of uniform [0, 1) inputs is 0.5 to within 0.001: a constant passes every ordinary input set.
    expectation = tmp_path / "expectation.py"
    expectation.write_text("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                           "        return torch.empty(x.shape[0], device=x.device).fill_(0.5)\n")
    task = TASKS / "row_mean.py"
    unscaled = Judge("cpu", fast_config(cache_dir, scaled_inputs=False)).evaluate(task, expectation)
    assert unscaled.correct, unscaled.error  # the hack would pass without the scaled input set
    verdict = cpu_judge.evaluate(task, expectation)
    assert verdict.reward == -1 and "scaled inputs (x" in verdict.error, verdict.error


def test_uninitialised_outputs_do_not_find_the_reference_leftovers(cpu_judge, tmp_path):
    # `empty` never written: in one process it could hand back the reference's freed output; here the reference
    # ran in another process, so the candidate gets whatever its own allocator had.
    lazy = python_candidate(tmp_path, "scale, shift", "pass", "torch.empty_like(x)")
    verdict = cpu_judge.evaluate(AFFINE, lazy)
    assert verdict.reward == -1 and verdict.error.startswith("incorrect"), verdict.error
