"""End to end on the CPU backend: build, verify, audit, time and reward real candidates."""

import time

import pytest

from conftest import CANDIDATES, TASKS, fast_config
from cuda_agent.judge import Judge
from cuda_agent.judge.verdict import OUT_OF_TIME
from cuda_agent.judge.scoring.reward import milestone_reward
from cuda_agent.task import TaskError, load_task
from cuda_agent.workspace.candidate import load_candidate

AFFINE = TASKS / "affine_relu.py"
KERNEL = "kernels/affine_relu.cpp"
BINDING = "kernels/affine_relu_binding.cpp"
STORE = "out[i] = std::max(x[i] * scale + shift, 0.f) * 0.5f;"
RETURN = "        return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)"


def before_return(lines: str) -> tuple[str, str]:
    """An edit of model_new.py: `lines` run in forward just before it calls the kernel."""
    return RETURN, lines + RETURN


def assert_judge_still_works(judge: Judge, workspace) -> None:
    verdict = judge.evaluate(AFFINE, workspace)
    assert verdict.correct and verdict.reward >= 1, verdict.error


def test_a_correct_fused_kernel_is_rewarded_by_the_comparison_it_was_timed_in(cpu_judge):
    verdict = cpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
    assert verdict.compiled and verdict.correct, verdict.error
    assert verdict.error is None and verdict.policy_violations == []
    t = verdict.times_us  # one pass instead of four: faster than eager in the same evaluation, by a wide margin
    noisy = verdict.timing["status"] == "too_noisy"
    assert t["candidate"] < t["eager"] and verdict.speedup_vs_eager == (None if noisy else t["eager"] / t["candidate"])
    assert verdict.reward == (1 if noisy else milestone_reward(True, t["candidate"], t["eager"], t["compile"]))
    assert verdict.reward >= 2 or noisy
    assert verdict.times_us["candidate"] > 0 and verdict.times_us["eager"] > 0 and verdict.times_us["compile"] > 0
    assert verdict.max_abs_error < 1e-5
    assert verdict.error_vs_fp64["candidate"] is not None and verdict.error_vs_fp64["ratio"] < 10
    assert verdict.backend == "cpu" and verdict.torch_version
    assert verdict.precision["float32_matmul_precision"] == "highest"
    assert len(verdict.seeds) == 5


def test_speed_of_light_bounds_are_reported_and_an_impossible_time_fails(cache_dir):
    fast_device = {"bytes": 1e15, "fp32": 1e18}
    honest = Judge("cpu", fast_config(cache_dir, device_peaks=fast_device)).evaluate(AFFINE,
                                                                                      CANDIDATES / "affine_relu_ok")
    bound = honest.timing["speed_of_light_us"]
    assert honest.correct and 0 < bound["outputs"] < bound["full"] < honest.times_us["candidate"], bound
    assert not any("speed of light" in w for w in honest.warnings)
    work = honest.timing["work"]
    assert work["flops"] == {} and work["bytes_in"] == work["bytes_out"] == 4 * (1 << 21)  # elementwise: no FLOPs
    # A made-up 10 MB/s device: writing 8 MB of outputs takes 0.8 s there, so the real few ms are impossible
    # (1 GB/s was not enough: the 2-core CI machine took ~7 ms).
    slow = {"bytes": 1e7, "fp32": 1e12}
    verdict = Judge("cpu", fast_config(cache_dir, device_peaks=slow)).evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
    assert verdict.reward == -1 and "faster than the speed of light" in verdict.error, verdict.error
    lenient = Judge("cpu", fast_config(cache_dir, device_peaks=slow, speed_of_light_fails=False)).evaluate(
        AFFINE, CANDIDATES / "affine_relu_ok")
    assert lenient.correct and any("speed of light" in w for w in lenient.warnings), lenient.warnings


def test_beating_the_permitted_precisions_peak_in_lower_precision_is_found(cache_dir, tmp_path):
    # fp32 FLOPs at a made-up 1 kFLOP/s: any real time beats the bound. With fp32 accuracy that is an algebraic
    # shortcut (a warning); with bf16-like error it is a precision downgrade (a failure).
    def linear_gelu(name: str, cast: str):
        path = tmp_path / f"{name}.py"
        path.write_text("import torch\nimport torch.nn.functional as F\n\n\nclass ModelNew(torch.nn.Module):\n"
                        "    def __init__(self, features):\n        super().__init__()\n"
                        "        self.linear = torch.nn.Linear(features, features)\n\n"
                        f"    def forward(self, x):\n        return F.gelu(self.linear(x{cast}))\n")
        return path

    judge = Judge("cpu", fast_config(cache_dir, policy="kernelbench", device_peaks={"bytes": 1e18, "fp32": 1e3}))
    task = TASKS / "linear_gelu.py"
    fp32 = judge.evaluate(task, linear_gelu("fp32", ""))
    assert fp32.correct and fp32.timing["speed_of_light_us"]["flops"] > fp32.times_us["candidate"], fp32.error
    assert any("algebraic shortcut" in w for w in fp32.warnings), fp32.warnings
    bf16 = judge.evaluate(task, linear_gelu("bf16", ".bfloat16().float()"))
    assert bf16.correct and not bf16.error, bf16.error  # within KernelBench's tolerance: its rule decides
    assert any(f.startswith("precision:") and "lower precision" in f for f in bf16.strict_findings), \
        bf16.strict_findings


def test_baselines_are_cached_and_unchanged_files_are_not_recompiled(cache_dir):
    trusting = Judge("cpu", fast_config(cache_dir, baseline_tolerance=100.0))  # any eager check agrees
    first = trusting.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
    second = trusting.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
    assert second.timing["baselines"]["source"] == "cache"
    assert second.times_us["eager"] == first.times_us["eager"]
    assert second.times_us["compile"] == first.times_us["compile"]
    assert all(step["cached"] for step in second.build["steps"] if step["source"] != "<link>")
    assert first.seeds != second.seeds  # fresh inputs every evaluation
    assert len(second.timing["baselines"]["eager_checks_us"][0]) == 2  # eager timed just before and after


POLYGLOT = '''#if 0
"""
#endif
#define FACTOR {factor}
#if 0
"""
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)
#endif
'''


def test_an_object_is_compiled_again_when_any_file_it_included_changes(cpu_judge, make_workspace):
    """Held out (red team, 2026-12-04): a kernel including `../model_new.py`, a C++/Python polyglot, kept its first
    object when only model_new.py changed (the cache key held the source and the headers only): the wrong factor
    was judged with the right one's object, in the episode and in the next that wrote the same kernel file."""
    ws = make_workspace(edits={"kernels/affine_relu.cpp": [("#include <algorithm>", '#include "../model_new.py"\n'
                                                            "#include <algorithm>"), ("* 0.5f;", "* FACTOR;")]})
    (ws / "model_new.py").write_text(POLYGLOT.format(factor="0.5f"))
    first = cpu_judge.compile(load_candidate(ws))
    assert first.ok, first.log
    (ws / "model_new.py").write_text(POLYGLOT.format(factor="0.25f"))
    again = {s.source: s.cached for s in cpu_judge.compile(load_candidate(ws)).steps}
    assert again["kernels/affine_relu.cpp"] is False and again["binding.cpp"] is True, again
    assert again["kernels/affine_relu_binding.cpp"] is True, again  # it never read model_new.py
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert not verdict.correct and "outside atol" in verdict.error, verdict.error
    # a fourth pass: a header whose name the compiler's dependency list escapes (`half$.h` as `half$$.h`)
    (ws / "model_new.py").write_text(POLYGLOT.format(factor="0.5f"))
    (ws / "kernels" / "half$.h").write_text("#define HALF 0.5f\n")
    kernel = ws / "kernels" / "affine_relu.cpp"
    kernel.write_text(kernel.read_text().replace('#include "../model_new.py"', '#include "half$.h"')
                      .replace("* FACTOR;", "* HALF;"))
    assert cpu_judge.compile(load_candidate(ws)).ok
    (ws / "kernels" / "half$.h").write_text("#define HALF 0.25f\n")
    again = {s.source: s.cached for s in cpu_judge.compile(load_candidate(ws)).steps}
    assert again["kernels/affine_relu.cpp"] is False, again


INCBIN = """asm(".section .rodata\\n.global factor_bytes\\nfactor_bytes:\\n.incbin \\"kernels/factor.h\\"\\n.text\\n");
extern "C" const char factor_bytes[];
#include <algorithm>"""


def test_a_file_read_only_by_the_assembler_recompiles_its_reader_and_nothing_else(cpu_judge, make_workspace):
    """A kernel that `.incbin`s a workspace file (no `#include`: the compiler's `-MD` list never names it) is compiled
    again when that file changes, as the kernel reports the file opened; the units that never opened it (the
    candidate's binding, the judge's) keep their objects, so an edit costs its own unit only."""
    ws = make_workspace(edits={"kernels/affine_relu.cpp": [("#include <algorithm>", INCBIN),
                                                           ("* 0.5f;", "* ((factor_bytes[0] - '0') / 10.0f);")]})
    (ws / "kernels" / "factor.h").write_text("5")
    assert cpu_judge.compile(load_candidate(ws)).ok
    assert cpu_judge.evaluate(AFFINE, ws).correct
    (ws / "kernels" / "factor.h").write_text("2")
    again = {s.source: s.cached for s in cpu_judge.compile(load_candidate(ws)).steps}
    assert again == {"kernels/affine_relu.cpp": False, "binding.cpp": True, "kernels/affine_relu_binding.cpp": True,
                     "<link>": False}, again
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert not verdict.correct and "outside atol" in verdict.error, verdict.error


def test_a_baseline_cached_in_a_noisy_moment_is_timed_again(cache_dir, cpu_judge):
    # The case: eager cached at 20x its real time would make any correct kernel look 20x faster (cached here at
    # 1000x: a check around the candidate slowed 20x by a loaded machine once agreed with 20x).
    # A wide tolerance: the baselines are cached (and mended) however loaded the machine is, and 1000x stays stale.
    judge = Judge("cpu", fast_config(cache_dir, baseline_tolerance=100.0))
    honest = judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
    key = judge.baseline_key(load_task(AFFINE), honest)
    cached = judge.store.get("baselines", key)
    slow = {k: v * 1000 if k.endswith("_us") else v for k, v in cached["eager"].items()}
    judge.store.put("baselines", key, {**cached, "eager": slow})
    verdict = judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
    record = verdict.timing["baselines"]
    assert record["source"] == "measured now", record
    assert "in the cached baseline timing" in record["remeasured_because"], record
    assert verdict.times_us["eager"] < slow["median_us"] / 4, verdict.times_us
    assert judge.store.get("baselines", key)["eager"]["median_us"] < slow["median_us"] / 4  # the cache is mended


def test_a_timing_too_noisy_to_trust_earns_no_speed_reward(cache_dir, tmp_path):
    # Every other call sleeps 20 ms: the median cannot be trusted, so the verdict claims no speedup.
    jittery = tmp_path / "jittery.py"
    jittery.write_text("import time\nimport torch\n\n\nclass ModelNew(torch.nn.Module):\n"
                       "    def __init__(self, scale, shift):\n        super().__init__()\n        self.n = 0\n"
                       "        self.scale, self.shift = scale, shift\n\n    def forward(self, x):\n"
                       "        self.n += 1\n        if self.n %% 2:\n            time.sleep(0.02)\n"
                       "        return torch.relu(x * self.scale + self.shift) * 0.5\n" % ())
    verdict = Judge("cpu", fast_config(cache_dir, policy="kernelbench", timing_attempts=2)).evaluate(AFFINE, jittery)
    assert verdict.correct and verdict.timing["status"] == "too_noisy", verdict.timing.get("baselines")
    assert verdict.reward == 1 and any("too noisy" in w for w in verdict.warnings), verdict.warnings
    assert verdict.timing["baselines"]["attempts"] == 2
    # no speedup either: a summary's fast_p or geomean would credit what the reward does not (red team, 2026-12-05)
    assert verdict.speedup_vs_eager is None and verdict.speedup_vs_compile is None and verdict.times_us["candidate"]


def test_wrong_result_gets_minus_one(cpu_judge, make_workspace):
    ws = make_workspace(edits={KERNEL: [(STORE, STORE.replace("0.5f", "0.55f"))]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and verdict.compiled and not verdict.correct
    assert verdict.error.startswith("incorrect:") and "outside atol" in verdict.error
    assert_judge_still_works(cpu_judge, CANDIDATES / "affine_relu_ok")


def test_a_candidate_that_fails_never_waits_for_torch_compile(cpu_judge, make_workspace, tmp_path):
    task = tmp_path / "affine_relu_again.py"  # a task judged nowhere before: no baseline cached for it
    task.write_text(AFFINE.read_text() + "\n# the same task, another hash\n")
    ws = make_workspace(edits={KERNEL: [(STORE, STORE.replace("0.5f", "0.55f"))]})
    verdict = cpu_judge.evaluate(task, ws)
    assert verdict.error.startswith("incorrect:") and "baseline_compile" not in verdict.phases_s, verdict.phases_s


def test_torch_compute_in_cxx_binding_is_caught_by_source_scan(cpu_judge, make_workspace):
    ws = make_workspace(edits={BINDING: [("return out;", "return torch::relu(x * scale + shift) * 0.5;")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1
    assert any("torch::relu" in v for v in verdict.policy_violations), verdict.policy_violations
    assert "policy violation" in verdict.error
    lenient = Judge("cpu", fast_config(cpu_judge.cache_dir, policy="kernelbench")).evaluate(AFFINE, ws)
    assert lenient.correct and not lenient.policy_violations, lenient.error  # torch ops are KernelBench's to allow
    assert any(f.startswith("source (strict would fail): ") and "torch::relu" in f for f in lenient.strict_findings), \
        lenient.strict_findings


def test_torch_compute_hidden_from_the_scan_is_caught_in_what_the_library_links(cpu_judge, make_workspace):
    # Tensor methods called from C++ are invisible to a text scan; the library links their ops (`at::_ops::`), which
    # the judge reads (the run-time audit would see them too, but its report comes from the candidate's process).
    ws = make_workspace(edits={BINDING: [("return out;", "return x.mul(scale).add(shift).clamp_min(0).mul(0.5);")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and verdict.compiled
    assert any("at::_ops::clamp_min" in v for v in verdict.policy_violations), verdict.policy_violations
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
    assert any("aten::mul" in v for v in verdict.policy_violations), verdict.policy_violations


BF16_STORE = ("uint32_t u; std::memcpy(&u, &x[i], 4); u &= 0xFFFF0000u; float v; std::memcpy(&v, &u, 4);\n"
              "        out[i] = std::max(v * scale + shift, 0.f) * 0.5f;")


def test_lower_precision_is_flagged_and_fails_in_strict_mode(cache_dir, cpu_judge, make_workspace):
    # Inputs truncated to bf16 inside the kernel: within atol=rtol=1e-2, but far from fp32 eager's own error.
    ws = make_workspace(edits={KERNEL: [("#include <cstdint>", "#include <cstdint>\n#include <cstring>"),
                                        (STORE, BF16_STORE)]})
    lenient = Judge("cpu", fast_config(cache_dir, max_error_ratio=None)).evaluate(AFFINE, ws)
    assert lenient.correct, lenient.error
    assert lenient.error_vs_fp64["ratio"] > 1000 and any("precision" in w for w in lenient.warnings)
    strict = cpu_judge.evaluate(AFFINE, ws)  # the default
    assert strict.reward == -1 and strict.error.startswith("precision:"), strict.error


def test_outputs_cached_across_calls_are_caught_on_the_checked_timed_calls(cpu_judge, make_workspace):
    # Honest for its first 12 calls (verification and warm-up), then the last output again: only the timed calls
    # whose outputs the trusted side picked and read can see it.
    ws = make_workspace(edits={"model_new.py": [
        ("        return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)",
         "        self.calls += 1\n"
         "        if self.calls <= 12 or self.last is None:\n"
         "            self.last = cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)\n"
         "        return self.last"),
        ("        self.shift = shift\n", "        self.shift = shift\n        self.calls, self.last = 0, None\n")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and "timed call" in verdict.error and "fresh values" in verdict.error, verdict.error


def test_outputs_cached_by_input_address_are_caught_at_once(cpu_judge, make_workspace):
    # Keyed on the input tensor's address: every call's inputs lie in the same buffer, written afresh each time.
    ws = make_workspace(edits={"model_new.py": [
        ("        return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)",
         "        key = (id(x), x.data_ptr())\n"
         "        if key not in self.cache:\n"
         "            self.cache[key] = (x, cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0))\n"
         "        return self.cache[key][1]"),
        ("        self.shift = shift\n", "        self.shift = shift\n        self.cache = {}\n")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and verdict.error.startswith("incorrect: input set 1"), verdict.error


def test_hard_coded_sizes_fail_the_extra_shape_check(cache_dir, cpu_judge, make_workspace):
    # Only whole blocks of 1024 elements are computed: right at the task's N = 2^21, wrong at the extra N = 2^20 + 1
    # (the rest filled in its own code: torch's fill_ took up to two thirds of its compiled code's time, near the CPU
    # sampler's rule, which is not what this test is about).
    ws = make_workspace(edits={BINDING: [("auto out = torch::empty_like(x);",
                                          "auto out = torch::empty_like(x);\n    std::fill_n(out.data_ptr<float>(), "
                                          "out.numel(), 123.f);"),
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
    assert "in native code called at File" in verdict.error and "model_new.py" in verdict.error, verdict.error
    assert verdict.warnings[-1].startswith("judged twice: the first process crashed with SIGSEGV"), verdict.warnings
    assert_judge_still_works(cpu_judge, CANDIDATES / "affine_relu_ok")


@pytest.mark.parametrize("first_error, warning", [
    ("candidate process crashed with SIGSEGV (segmentation fault): in __exit__",
     "judged twice: the first process crashed with SIGSEGV (segmentation fault): in __exit__"),
    ("evaluation aborted: reference affine_relu.py: the reference worker exited with code 0",
     "judged twice: the first evaluation aborted: reference affine_relu.py: the reference worker exited with code 0"),
])
def test_a_candidate_killed_by_a_signal_or_a_reference_failure_once_is_judged_again(cpu_judge, monkeypatch,
                                                                                     first_error, warning):
    """torch's profiler has crashed now and then on exit in the candidate's process with correct kernels, and a
    reference worker has ended mid-evaluation (5 of 229 verdicts on the H200): either gets a second evaluation in
    fresh processes, and the verdict says so."""
    from cuda_agent.judge import judge as judge_module

    runs, real = [], judge_module.Evaluation.run

    def fails_first(evaluation):
        runs.append(evaluation.verdict)
        if len(runs) == 1:
            evaluation.verdict.error = first_error
            return
        real(evaluation)

    monkeypatch.setattr(judge_module.Evaluation, "run", fails_first)
    verdict = cpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
    assert len(runs) == 2 and verdict.correct and verdict.reward >= 1, verdict.error
    assert verdict.warnings[-1] == warning


def test_a_crash_at_the_caller_s_deadline_is_not_judged_again(cpu_judge, monkeypatch):
    """A deadline (an episode's time limit) passed: the candidate is not judged a second time after it."""
    from cuda_agent.judge import judge as judge_module

    runs = []

    def crashes(evaluation):
        runs.append(evaluation.verdict)
        evaluation.verdict.error = "candidate process crashed with SIGSEGV (segmentation fault)"
        time.sleep(0.3)

    monkeypatch.setattr(judge_module.Evaluation, "run", crashes)
    verdict = cpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok", deadline=time.monotonic() + 0.2)
    assert len(runs) == 1 and "SIGSEGV" in verdict.error and not verdict.warnings, verdict


def test_hang_is_killed_at_the_timeout_or_at_the_caller_s_deadline(cache_dir, make_workspace):
    """A hang is waited for until its timeout; with a caller's deadline (an episode's time limit) before it, until
    the deadline, and the verdict says the deadline ended it (not the candidate's failure: judged again, it may
    pass)."""
    judge = Judge("cpu", fast_config(cache_dir, run_timeout_s=12))
    ws = make_workspace(edits={KERNEL: [("(void)config;", "(void)config; volatile int spin = 1; while (spin) {}")]})
    verdict = judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and "timed out" in verdict.error and not verdict.error.startswith(OUT_OF_TIME)
    assert verdict.seconds < 120
    cut = judge.evaluate(AFFINE, ws, deadline=time.monotonic() + 4)  # (its objects cached: cut in its run)
    assert cut.reward == -1 and cut.error.startswith(OUT_OF_TIME) and "timed out" in cut.error, cut.error
    assert cut.seconds < 8, cut.phases_s
    late = judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok", deadline=time.monotonic() - 1)
    assert late.error.startswith(OUT_OF_TIME) and "phases done: none" in late.error and late.seconds < 2, late
    judge.config.run_timeout_s = 90  # (an honest run took 16 s of a loaded CI machine's time: over the hang's 12)
    assert_judge_still_works(judge, CANDIDATES / "affine_relu_ok")


def test_a_slow_torch_compile_baseline_ends_at_the_caller_s_deadline(cpu_judge, tmp_path):
    """torch.compile's baseline (compiled once a task, after the candidate is verified) can take minutes on a large
    model: with a caller's deadline (an episode's time limit) before it ends, the wait ends there and the verdict
    says the deadline cut it (it ran to its own timeout before: a recipe's time limit was overrun by minutes)."""
    task = tmp_path / "affine_relu_slow_compile.py"
    slow = "        if torch.compiler.is_compiling():  # (compiled code only)\n            time.sleep(120)\n"
    source = AFFINE.read_text().replace("        return torch.relu(", slow + "        return torch.relu(")
    task.write_text("import time\n" + source)
    assert_judge_still_works(cpu_judge, CANDIDATES / "affine_relu_ok")  # (built: the deadline is for the rest)
    verdict = cpu_judge.evaluate(task, CANDIDATES / "affine_relu_ok", deadline=time.monotonic() + 20)
    assert verdict.error.startswith(OUT_OF_TIME) and "verify" in verdict.error, verdict.error
    assert verdict.seconds < 45, verdict.phases_s


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


def test_load_inline_builds_share_one_budget_per_evaluation(cache_dir, tmp_path):
    # The same build asked for again and again (each one from the cache): the calls past the budget's count fail.
    source = (CANDIDATES / "affine_relu_single.py").read_text()
    many = tmp_path / "many_builds.py"
    many.write_text(source.replace("ext = load_inline(", "for _ in range(3):\n    ext = load_inline(", 1))
    verdict = Judge("cpu", fast_config(cache_dir, max_builds=2)).evaluate(AFFINE, many)
    assert verdict.reward == -1 and "build budget is spent" in verdict.error, verdict.error
    assert len(verdict.build["inline"]) == 3 and "error" in verdict.build["inline"][-1]


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
    ("import_error.py", "imports a_module_that_does_not_exist, which is not installed here"),  # before any build
    ("import_raises.py", "importing the reference failed: RuntimeError: this reference fails when imported"),
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
    # The hack would pass without scaled inputs (and without the precision limit: its error is 2e-3 vs fp64).
    unscaled = Judge("cpu", fast_config(cache_dir, scaled_inputs=False, max_error_ratio=None)).evaluate(task,
                                                                                                       expectation)
    assert unscaled.correct, unscaled.error
    verdict = cpu_judge.evaluate(task, expectation)
    # Every input set but the first is scaled by a factor drawn for it (as every timed call is): the second fails.
    assert verdict.reward == -1 and verdict.error.startswith("incorrect: input set 1:"), verdict.error


def test_uninitialised_outputs_do_not_find_the_reference_leftovers(cpu_judge, tmp_path):
    # `empty` never written: in one process it could hand back the reference's freed output; here the reference
    # ran in another process, so the candidate gets whatever its own allocator had.
    lazy = python_candidate(tmp_path, "scale, shift", "pass", "torch.empty_like(x)")
    verdict = cpu_judge.evaluate(AFFINE, lazy)
    assert verdict.reward == -1 and verdict.error.startswith("incorrect"), verdict.error


REGISTRATION = """
static void register_affine_relu(pybind11::module& m) {
    m.def("affine_relu_forward", &affine_relu_forward, py::arg("x"), py::arg("scale"), py::arg("shift"),
          py::arg("config") = 0);
}

REGISTER_BINDING(affine_relu, register_affine_relu);
"""
ATEN_DIRECT = r"""#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include "../binding_registry.h"

// ATen's CPU kernels declared by hand, in a namespace the preprocessor assembles: no `at::cpu` in the text,
// no dispatcher at run time.
#define JOIN(a, b) a##b
#define NS JOIN(c, pu)
namespace at { namespace NS {
at::Tensor mul(const at::Tensor& self, const at::Tensor& other);
at::Tensor add(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha);
at::Tensor clamp_min(const at::Tensor& self, const c10::Scalar& min);
} }
namespace kernels = at::NS;

static torch::Tensor affine_relu_forward(torch::Tensor x, double scale, double shift, int config) {
    auto s = torch::empty({}, x.options());
    s.fill_(scale * 0.5);
    auto b = torch::empty({}, x.options());
    b.fill_(shift * 0.5);
    return kernels::clamp_min(kernels::add(kernels::mul(x, s), b, 1), 0);
}

""" + REGISTRATION


def test_aten_kernels_called_past_the_dispatcher_are_caught_by_the_linker(cpu_judge, make_workspace):
    ws = make_workspace()
    (ws / BINDING).write_text(ATEN_DIRECT)
    (ws / KERNEL).write_text('extern "C" void unused_kernel() {}\n')
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and verdict.compiled, verdict.error
    assert any("at::cpu::mul" in v and "without the dispatcher" in v for v in verdict.policy_violations), \
        verdict.policy_violations
    assert "candidate_load" not in verdict.phases_s  # refused by the judge after the build: nothing of it ran
    # Neither the source scan nor the op audit sees it: under rules that allow torch ops it runs and is correct.
    assert not [v for v in verdict.policy_violations if not v.startswith("native code:")]
    lenient = Judge("cpu", fast_config(cpu_judge.cache_dir, policy="kernelbench")).evaluate(AFFINE, ws)
    assert lenient.correct, lenient.error
    assert any(f.startswith("native code (strict would fail): ") and "at::cpu::mul" in f
               for f in lenient.strict_findings), lenient.strict_findings  # what strict would say, said


def test_torch_functions_looked_up_through_ctypes_are_caught(cpu_judge, tmp_path):
    # sgemm_ and ATen's kernels are exported by libtorch_cpu: a Python candidate can look them up by name.
    probe = tmp_path / "ctypes_lookup.py"
    probe.write_text("import ctypes\nimport os\nimport torch\n\nlib = ctypes.CDLL(os.path.join(os.path.dirname("
                     "torch.__file__), 'lib', 'libtorch_cpu.so'))\nsgemm = lib.sgemm_\n\n\n"
                     "class ModelNew(torch.nn.Module):\n    def __init__(self, scale, shift):\n"
                     "        super().__init__()\n\n    def forward(self, x):\n        return x.new_zeros(x.shape)\n")
    verdict = cpu_judge.evaluate(AFFINE, probe)
    assert verdict.reward == -1 and "ctypes lookup: 'sgemm_'" in verdict.error, verdict.error


def test_a_process_started_in_forward_fails_at_once(cpu_judge, tmp_path):
    # The child does the work while the parent waits: it would escape the op audit, and a stuck child held the
    # judge until its timeout.
    forker = python_candidate(tmp_path, "scale, shift", "import os; self.fork = os.fork",
                              "(self.fork() or x.new_zeros(x.shape))")
    verdict = cpu_judge.evaluate(AFFINE, forker)
    assert verdict.reward == -1 and "SIGSYS" in verdict.error and "start a process" in verdict.error, verdict.error
    assert verdict.seconds < 60


def test_a_process_left_running_from_init_fails(cpu_judge, tmp_path):
    helper = python_candidate(tmp_path, "scale, shift", "import subprocess; self.p = subprocess.Popen(['sleep', '30'])",
                              "x.new_zeros(x.shape)")
    verdict = cpu_judge.evaluate(AFFINE, helper)
    # (strict: refused from the start since 2026-12-06; the kernelbench policy still finds it left running)
    assert verdict.reward == -1 and ("left processes running" in verdict.error and "sleep" in verdict.error
                                     or "Operation not permitted" in verdict.error), verdict.error


LATE_THREAD = """#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <chrono>
#include <thread>
#include "../binding_registry.h"

extern "C" void affine_relu_launcher(float* out, const float* x, float scale, float shift, int64_t n, int config);

// Returns at once; a thread of its own fills the output afterwards (the timer stops when forward returns).
static torch::Tensor affine_relu_forward(torch::Tensor x, double scale, double shift, int config) {
    auto out = torch::empty_like(x);
    float* o = out.data_ptr<float>();
    const float* in = x.data_ptr<float>();
    const int64_t n = x.numel();
    std::thread([=] {  // later than the call's answer, on any machine: it must lose the race to the stop
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        affine_relu_launcher(o, in, (float)scale, (float)shift, n, config);
    }).detach();
    return out;
}

""" + REGISTRATION


def test_work_left_to_a_thread_after_forward_returns_fails(cpu_judge, make_workspace):
    # The trusted side stops every thread of the candidate when `done` comes and reads the outputs then: what the
    # thread had not written by that moment is missing. (Its work starts 50 ms late: without that, a busy CI machine
    # once let it win the race to the stop on a call, inside the call's window, where it is simply timed.)
    ws = make_workspace()
    (ws / BINDING).write_text(LATE_THREAD)
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and verdict.error.startswith("incorrect: input set 0"), verdict.error


def test_every_call_is_audited_so_none_can_compute_differently(cpu_judge, make_workspace):
    # A candidate could compute with torch whenever no op audit is watching (it can see the audit). On the cpu
    # backend, whose clock cannot tell whose code ran, no call of forward, timed ones included, goes unaudited.
    ws = make_workspace(edits={"model_new.py": [before_return(
        "        from torch.utils._python_dispatch import _get_current_dispatch_mode\n"
        "        if _get_current_dispatch_mode() is None:\n"
        "            raise RuntimeError('an unaudited call: torch compute would go unseen here')\n")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.correct and verdict.reward >= 1, verdict.error


def test_a_library_the_candidate_builds_and_loads_itself_is_checked(cpu_judge, tmp_path):
    # Compiled at import into the candidate's private /tmp and loaded with ctypes: never seen by the judge's builder.
    probe = tmp_path / "own_library.py"
    probe.write_text("import ctypes\nimport subprocess\nimport tempfile\nimport torch\n\n"
                     "src = tempfile.mktemp(suffix='.c')\nopen(src, 'w').write('#include <dlfcn.h>\\n"
                     "void* find(void* h, const char* s) { return dlsym(h, s); }\\n')\n"
                     "lib = src[:-2] + '.so'\n"
                     "subprocess.run(['gcc', '-shared', '-fPIC', src, '-o', lib, '-ldl'], check=True)\n"
                     "ctypes.CDLL(lib)\n\n\nclass ModelNew(torch.nn.Module):\n"
                     "    def __init__(self, scale, shift):\n        super().__init__()\n\n"
                     "    def forward(self, x):\n        return x.new_zeros(x.shape)\n")
    verdict = cpu_judge.evaluate(AFFINE, probe)
    # (strict: since 2026-12-06 the compiler cannot even be started from the candidate's process)
    assert verdict.reward == -1 and ("links 'dlsym'" in verdict.error or "Operation not permitted" in verdict.error), \
        verdict.error


def test_no_timed_call_sees_input_values_seen_before(cpu_judge, make_workspace):
    # The held-out attack remembered answers under a fingerprint of a few sampled input elements. Here the candidate
    # fails loudly on any such hit: with fresh values before every call there is none to serve.
    ws = make_workspace(edits={"model_new.py": [
        before_return("        key = tuple(x.view(-1)[::65536].tolist())\n"
                      "        if key in self.seen:\n"
                      "            raise RuntimeError('these inputs were seen before: "
                      "the answer could come from memory')\n"
                      "        self.seen.add(key)\n"),
        ("        self.shift = shift\n", "        self.shift = shift\n        self.seen = set()\n")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.correct and verdict.timing["candidate"]["iters"] >= 10, verdict.error


def test_the_kernelbench_policy_allows_torch_ops_and_reports_what_strict_would_find(cache_dir, cpu_judge, tmp_path):
    torch_ops = python_candidate(tmp_path, "scale, shift", "self.scale, self.shift = scale, shift",
                                 "torch.relu(x * self.scale + self.shift) * 0.5")
    strict = cpu_judge.evaluate(AFFINE, torch_ops)
    assert strict.reward == -1 and strict.policy == "strict" and "aten::" in strict.error, strict.error
    kernelbench = Judge("cpu", fast_config(cache_dir, policy="kernelbench"))
    verdict = kernelbench.evaluate(AFFINE, torch_ops)
    assert verdict.correct and verdict.reward >= 1 and verdict.policy == "kernelbench", verdict.error
    ops = [f for f in verdict.strict_findings if f.startswith("runtime ops (strict would fail): ")]
    assert any("aten::relu" in f for f in ops) and any("aten::mul" in f for f in ops), verdict.strict_findings
    threaded = kernelbench.evaluate(AFFINE, CANDIDATES / "background_thread.py")  # the ops in another thread
    assert threaded.correct and any(f.startswith("runtime ops (strict would fail): ") and "aten::mul" in f
                                    for f in threaded.strict_findings), threaded.strict_findings
    kernel = kernelbench.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")  # its own kernel: nothing to say
    assert kernel.correct and not kernel.strict_findings and "audit_call" in kernel.phases_s, kernel.strict_findings
    mutating = python_candidate(tmp_path, "scale, shift", "self.scale, self.shift = scale, shift",
                                "torch.relu(x.mul_(self.scale).add_(self.shift)) * 0.5")
    mutated = kernelbench.evaluate(AFFINE, mutating)  # KernelBench's rule passes it; the strict judge would not
    assert mutated.correct and any("modified in place" in f for f in mutated.strict_findings), mutated.strict_findings


def test_the_candidate_s_own_op_report_is_bounded_in_the_verdict(cache_dir, tmp_path):
    """The run-time op audit's findings come from the candidate's own process: one that rewrites the worker's audit
    (white box: it runs as the worker's `__main__`) to report 50 findings of 10,000 characters each puts at most 20,
    of at most 500 characters, into the verdict, and its verdict is KernelBench's as before."""
    forge = ("self.scale, self.shift = scale, shift\n        import sys\n        "
             "sys.modules['__main__'].LoadedCandidate.audit_call = lambda self: ['x' * 10_000] * 50")
    forged = python_candidate(tmp_path, "scale, shift", forge, "torch.relu(x * self.scale + self.shift) * 0.5")
    verdict = Judge("cpu", fast_config(cache_dir, policy="kernelbench")).evaluate(AFFINE, forged)
    assert verdict.correct and verdict.reward >= 1, verdict.error
    ops = [f for f in verdict.strict_findings if f.startswith("runtime ops (strict would fail): ")]
    assert len(ops) == 20 and set(ops) == {"runtime ops (strict would fail): " + "x" * 500}, ops[:1]


def test_the_kernelbench_policy_reports_weights_ignored_after_construction(cache_dir, tmp_path):
    """Held out (red team, 2026-12-04): a transposed copy of the weight made in `__init__` and used instead of the
    parameter is right under KernelBench's seeded construction and wrong under strict (which loads Model's state
    dict after construction): the kernelbench verdict passes it and now says what strict would."""
    body = "self.linear = torch.nn.Linear(features, features)\n        {}"
    forward = "torch.nn.functional.gelu(x @ {} + self.linear.bias)"
    relaid = python_candidate(tmp_path, "features", body.format("self.wt = self.linear.weight.detach().t().clone()"),
                              forward.format("self.wt"))
    task = TASKS / "linear_gelu.py"
    kernelbench = Judge("cpu", fast_config(cache_dir, policy="kernelbench"))
    verdict = kernelbench.evaluate(task, relaid)
    assert verdict.correct, verdict.error
    assert any("weights loaded after construction" in f and "outside atol" in f for f in verdict.strict_findings), \
        verdict.strict_findings
    assert Judge("cpu", fast_config(cache_dir)).evaluate(task, relaid).reward == -1
    honest = python_candidate(tmp_path, "features", body.format("pass"), forward.format("self.linear.weight.t()"))
    verdict = kernelbench.evaluate(task, honest)  # (its torch ops are what strict would fail, and all it says)
    assert verdict.correct and verdict.strict_findings, verdict.strict_findings
    assert all(f.startswith("runtime ops (strict would fail): torch op aten::") for f in verdict.strict_findings)


def test_a_wrong_shape_described_as_a_large_tensor_is_not_read(cpu_judge, tmp_path):
    """Held out (red team, 2026-12-05): 4 bytes described as a huge tensor of the wrong shape were copied out (and
    cloned) before the shapes were compared; the reference worker reads no more than 4x its own outputs' size now.
    (That expanded view now fails as an output that overlaps itself; a real tensor of the wrong size meets the
    bound.)"""
    huge = python_candidate(tmp_path, "scale, shift", "pass", "torch.empty(1 << 24)")
    verdict = cpu_judge.evaluate(AFFINE, huge)
    assert verdict.reward == -1 and "more than" in verdict.error, verdict.error
    (tmp_path / "expanded").mkdir()
    expanded = python_candidate(tmp_path / "expanded", "scale, shift", "pass", "torch.zeros(1).expand(1 << 24)")
    verdict = cpu_judge.evaluate(AFFINE, expanded)
    assert verdict.reward == -1 and "overlaps itself (strides [0]" in verdict.error, verdict.error


def test_reference_workers_stay_warm_with_fresh_weights_per_evaluation(cache_dir, tmp_path):
    weights = python_candidate(tmp_path, "features", "self.linear = torch.nn.Linear(features, features)",
                               "(_ for _ in ()).throw(RuntimeError('W=%.6f' % float(self.linear.weight.sum())))")
    task = TASKS / "linear_gelu.py"
    with Judge("cpu", fast_config(cache_dir, warm_references=1)) as judge:
        first = judge.evaluate(task, weights)
        (worker,) = judge.references.workers.values()
        second = judge.evaluate(task, weights)
        assert list(judge.references.workers.values()) == [worker] and worker.process.proc.poll() is None
        assert second.phases_s["reference_ready"] < 0.5 <= first.phases_s["reference_ready"], (first.phases_s,
                                                                                              second.phases_s)
        assert first.error.split("W=")[1] != second.error.split("W=")[1]  # new weights every evaluation
        assert "(at model_new.py:10 in <genexpr> <- model_new.py:10 in forward" in first.error, first.error
        judge.evaluate(AFFINE, weights)  # another task: the least recently used worker goes (one kept)
        assert worker.process.proc.poll() is not None and len(judge.references.workers) == 1
        with pytest.raises(TaskError):
            judge.evaluate(TASKS / "broken" / "bad_inputs.py", weights)
        assert all(w.task.name != "bad_inputs" for w in judge.references.workers.values())
    assert not judge.references.workers
    # baselines of these settings not cached (then cached however loaded the machine is: a tolerance of 100x)
    with Judge("cpu", fast_config(cache_dir, min_iters=11, baseline_tolerance=100.0)) as judge:
        first, second = (judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok") for _ in range(2))
        assert first.correct and second.correct, (first.error, second.error)
        assert "baseline_compile" in first.phases_s  # torch.compile compiled before the device was held
        assert "baseline_compile" not in second.phases_s and second.phases_s["reference_ready"] < 0.5


def test_candidate_workers_start_ahead_and_serve_one_evaluation_each(cache_dir):
    with Judge("cpu", fast_config(cache_dir, spare_candidates=1, keep_run_dirs=True)) as judge:
        first = judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
        (spare,) = judge.spares._ready  # started as the first evaluation ended
        assert spare.worker.proc.poll() is None and not (spare.run_dir / "task" / AFFINE.name).exists()
        second = judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
        assert first.correct and second.correct, (first.error, second.error)
        assert (spare.run_dir / "task" / AFFINE.name).read_text() == AFFINE.read_text()  # the spare's folder served
        assert spare.worker.proc.poll() is not None  # and its worker is gone: one evaluation each
        (after,) = judge.spares._ready
        assert after.worker.proc.pid != spare.worker.proc.pid
    assert after.worker.proc.poll() is not None and not judge.spares._ready  # closing stops the spares
    with Judge("cpu", fast_config(cache_dir, spare_candidates=0)) as judge:
        judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
        assert not judge.spares._ready


def test_an_input_set_the_reference_itself_fails_on_is_skipped_for_the_candidate_too(cache_dir, tmp_path):
    # KernelBench level1/100_HingeLoss in small, made to run at its own sizes only (64 elements a row): at the extra
    # shapes (batch 5, input_shape[0] 5, together or one by one) the reference fails, so that set is skipped; the
    # candidate (the reference itself) fails there too and must still be judged on the rest
    task = tmp_path / "hinge.py"
    task.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, predictions, targets):\n"
                    "        return torch.mean(torch.clamp(1 - predictions * targets, min=0).view(-1, 64))\n\n\n"
                    "batch_size = 8\ninput_shape = (8,)\n\n\ndef get_inputs():\n"
                    "    return [torch.rand(batch_size, *input_shape), "
                    "torch.randint(0, 2, (batch_size,)).float() * 2 - 1]"
                    "\n\n\ndef get_init_inputs():\n    return []\n")
    candidate = tmp_path / "hinge_new.py"
    candidate.write_text(task.read_text() + "\n\nModelNew = Model\n")
    with Judge("cpu", fast_config(cache_dir, policy="kernelbench")) as judge:
        verdict = judge.evaluate(task, candidate)
    assert verdict.correct and verdict.reward >= 1, verdict.error
    assert any(w.startswith("extra shape not checked: the task does not run at other sizes") and "batch_size=5" in w
               for w in verdict.warnings), verdict.warnings
