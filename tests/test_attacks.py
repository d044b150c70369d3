"""White-box attacks on the judge's trust boundary (cpu backend), written as a policy that has read the judge's source
would write them: each reaches into the candidate's own process (the only one it controls) for something that once
decided a verdict there. Each docstring names the defence that meets it (docs/threat-model.md, "Attacks on the
trust boundary"); each test fails when that defence is removed.

Every candidate here is the honest fused kernel of tests/data/candidates/affine_relu_ok with a different
model_new.py (the kernel is built once and cached).
"""

import textwrap

import pytest

from conftest import TASKS, fast_config
from cuda_agent.judge import Judge

AFFINE = TASKS / "affine_relu.py"
HEADER = "import os, sys, threading, time\nimport torch\nimport torch.nn as nn\n\nimport cuda_extension\n\n"
KERNEL = "cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)"


def candidate(make_workspace, body: str, init: str = "", prelude: str = ""):
    """The workspace with a ModelNew whose __init__ runs `init` and whose forward is `body` (`x` the input; the
    honest kernel call is KERNEL); `prelude` runs at import."""
    ws = make_workspace()
    (ws / "model_new.py").write_text(
        HEADER + textwrap.dedent(prelude) + "\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self, scale: float, shift: float):\n        super().__init__()\n"
        "        self.scale, self.shift = scale, shift\n" + textwrap.indent(textwrap.dedent(init), "        ")
        + "\n    def forward(self, x):\n" + textwrap.indent(textwrap.dedent(body), "        ") + "\n")
    return ws


def test_every_clock_in_its_process_faked_the_candidate_is_still_timed_at_its_real_speed(cpu_judge, make_workspace):
    """Every clock of its process faked during its calls (and put back before each returns, so that no in-process
    check sees a replaced function), and a sleep: the clock that counts runs in the trusted process."""
    ws = candidate(make_workspace, """
        names = ("perf_counter", "monotonic", "time", "process_time", "thread_time")
        real = {n: getattr(time, n) for n in names} | {n + "_ns": getattr(time, n + "_ns") for n in names}
        for name in real:
            setattr(time, name, (lambda: 0) if name.endswith("_ns") else (lambda: 0.0))
        real["sleep"] = time.sleep
        real["sleep"](0.03)
        for name, clock in real.items():
            setattr(time, name, clock)
        return """ + KERNEL)
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.correct, verdict.error
    assert verdict.times_us["candidate"] >= 30_000 and verdict.reward == 1


def test_answering_done_at_once_and_computing_afterwards_is_never_seen(cpu_judge, make_workspace):
    """The harness found through the collector and its `describe` rewritten to hand out the output at once while a
    thread computes it: the trusted side stops every thread as `done` arrives and reads the output then. (The
    collector's use is itself a violation; the verdict fails on what was read first.)"""
    ws = candidate(make_workspace, """
        if not self.patched:
            import gc
            harness = next(o for o in gc.get_objects() if type(o).__name__ == "Callee")
            real = harness.forward
            def early(inputs, fn):
                out = torch.empty_like(inputs[0])
                def late():
                    time.sleep(0.002)
                    out.copy_(real(inputs, fn))
                threading.Thread(target=late).start()
                return out
            harness.forward = early
            self.patched = True
        return """ + KERNEL, init="self.patched = False")
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and verdict.error.startswith("incorrect: input set 1"), verdict.error


def test_a_task_module_rebound_in_its_process_changes_no_input(cpu_judge, make_workspace):
    """`get_inputs` rebound to zeros in every module that has one, and the answer for zeros returned: the inputs are
    drawn by the trusted side, and the candidate's process holds no task module at all."""
    ws = candidate(make_workspace, """
        found = [m for m in list(sys.modules.values())
                 if callable(getattr(m, "__dict__", {}).get("get_inputs")) and hasattr(m, "Model")]
        for module in found:
            module.get_inputs = lambda: [torch.zeros(1 << 21)]
        if found:
            return torch.full_like(x, max(self.shift, 0.0) * 0.5)
        return """ + KERNEL)
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.correct and verdict.reward >= 1, verdict.error


def test_no_call_can_be_told_apart_by_its_values(cpu_judge, make_workspace):
    """A candidate that would compute honestly only where the inputs look scaled (and cheat elsewhere): every call
    but the first draws a scale for its inputs, so it finds the task's own distribution in almost none of them
    (about 1 in 8 at the 21st call: the first set and the extra shape, and a scale within ~5% of 1 about 1 time in
    30; a limit of 1 in 5 failed about 1 run in 20, so it is 1 in 3; without scales it would be every call)."""
    ws = candidate(make_workspace, """
        import ctypes, struct
        sample = struct.unpack("4096f", ctypes.string_at(x.data_ptr(), 4 * 4096))
        self.calls += 1
        self.nominal += abs((sum(v * v for v in sample) / len(sample)) ** 0.5 - 1.0) < 0.04
        if self.calls > 20 and self.nominal > self.calls // 3:
            raise RuntimeError(f"{self.nominal} of {self.calls} calls had the task's own input distribution")
        return """ + KERNEL, init="self.calls = self.nominal = 0")
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.correct, verdict.error


def test_no_two_calls_share_their_inputs_so_remembering_answers_never_pays(cpu_judge, make_workspace):
    """A candidate that would answer from memory any input it has seen before (a cheap fingerprint of a few
    elements): every call of every phase gets fresh values, drawn on the trusted side, so none repeats (this one
    fails the moment one does)."""
    ws = candidate(make_workspace, """
        flat = x.reshape(-1)
        key = (tuple(x.shape), float(flat[0]), float(flat[-1]), float(flat[flat.numel() // 2]))
        if key in self.seen:
            raise RuntimeError(f"call {len(self.seen) + 1}: these inputs were seen before: answer from memory")
        self.seen.add(key)
        return """ + KERNEL, init="self.seen = set()")
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.correct, verdict.error


def test_cheating_on_every_call_after_verification_is_caught_by_the_checked_timed_calls(cpu_judge, make_workspace):
    """Read from the judge's source: this task's verification is its first 7 calls (5 trials, a scaled set, an extra
    shape), the rest are timing. Garbage from call 8 on is caught because timed calls drawn one by one, which the
    candidate cannot tell from the others beforehand, have their outputs read and compared. Without them
    (`timed_check_bits=0`) it scored reward 3 at 2.8x torch.compile; a candidate wrong on half its timed calls (what
    moving the median takes) escapes them 1 time in 2**timed_check_bits (1,024)."""
    ws = candidate(make_workspace, """
        self.calls += 1
        return torch.empty_like(x) if self.calls > 7 else """ + KERNEL, init="self.calls = 0")
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert not verdict.correct and "timed call" in verdict.error, verdict.error


def test_a_thread_spinning_between_calls_is_held_still(cpu_judge, make_workspace):
    """A thread that burns the CPU whenever forward is not running (to slow the baselines timed beside it): between
    calls every thread of the candidate is stopped (and were it not, its CPU time between calls, read from the
    kernel, would fail it)."""
    ws = candidate(make_workspace, "self.busy.clear()\nout = " + KERNEL + "\nself.busy.set()\nreturn out", init="""
        self.busy = threading.Event()
        self.busy.set()
        def spin():
            while True:
                self.busy.wait()
        threading.Thread(target=spin, daemon=True).start()
    """)
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.correct, verdict.error
    # Not stopped, the spinner would have burnt every pause between calls (input writes, cache flushes, checks):
    # the kernel's clocks of its processes, read at each stop and each resume, show it ran 0 us in them.
    assert verdict.timing["candidate"]["cpu_outside_calls_us"] == 0, verdict.timing["candidate"]


@pytest.mark.parametrize("reach", [
    "import gc\nharness = [o for o in gc.get_objects() if type(o).__name__ == 'Callee']",
    "frame = sys._getframe(1)\nharness = frame.f_locals",
    "try:\n    raise ValueError\nexcept ValueError as e:\n    harness = e.__traceback__.tb_frame.f_back",
    "sys.settrace(lambda *a: None)\nsys.settrace(None)",
])
def test_reaching_for_the_harness_in_its_process_is_a_policy_violation(cpu_judge, make_workspace, reach):
    """The collector, frames and trace hooks: an audit hook that cannot be removed sees them (a second line: nothing
    the harness holds decides a verdict any more)."""
    ws = candidate(make_workspace, reach + "\nreturn " + KERNEL)
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and "introspection" in verdict.error, verdict.error


def test_torch_compute_after_popping_the_audits_dispatch_mode_is_seen(cpu_judge, make_workspace):
    """The dispatch mode the op audit pushes popped off its stack inside forward, then torch computes: the profiler
    records every op of every thread, the harness's thread included."""
    ws = candidate(make_workspace, """
        from torch.utils._python_dispatch import _pop_mode_temporarily
        with _pop_mode_temporarily():
            return torch.relu(x * self.scale + self.shift) * 0.5""")
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and "policy violation" in verdict.error and "aten::" in verdict.error, verdict.error


def test_turning_the_profiler_off_fails_the_audits_challenge(cpu_judge, make_workspace):
    """The all-threads profiler switched off from forward: at the end the trusted side asks the audit to see a number
    of canary ops it draws; a profiler that is off sees none."""
    ws = candidate(make_workspace, """
        from torch.utils._python_dispatch import _pop_mode_temporarily
        if not self.off:
            self.off = True
            torch.autograd._disable_profiler()
        with _pop_mode_temporarily():
            return torch.relu(x * self.scale + self.shift) * 0.5""", init="self.off = False")
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and "policy violation" in verdict.error, verdict.error


def test_a_background_thread_named_like_the_harness_is_still_a_background_thread(cpu_judge, make_workspace):
    """Torch compute on a thread that opens a range with the audit's old harness marker and takes the main thread's
    name: on the trusted path every thread's ops count (and elsewhere the harness's thread is known by its native
    id)."""
    ws = candidate(make_workspace, """
        result = []
        def work():
            with torch.autograd.profiler.record_function("cuda_agent_harness_thread"):
                result.append(torch.relu(x * self.scale + self.shift) * 0.5)
        t = threading.Thread(target=work, name="MainThread")
        t.start()
        t.join()
        return result[0]""")
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and "policy violation" in verdict.error and "aten::" in verdict.error, verdict.error


def test_numpy_cannot_be_imported_under_the_strict_policy(cpu_judge, make_workspace):
    """numpy computes outside torch's dispatcher, where the op audit cannot see: under the strict policy the
    candidate's view of the file system has no numpy (nor scipy, numba, jax...)."""
    ws = candidate(make_workspace, """
        import numpy as np
        return torch.from_numpy(np.maximum(x.numpy() * self.scale + self.shift, 0) * 0.5)""")
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1 and "numpy" in verdict.error, verdict.error


def test_a_process_hidden_from_the_in_process_check_is_found_from_outside(cpu_judge, make_workspace):
    """A helper process forked in __init__ (before the seccomp filter), hidden from the worker's own check by a tmpfs
    mounted over its /proc entry (the candidate is root of its own mount namespace): the judge lists the candidate's
    processes itself, in its own /proc, before the first call."""
    ws = candidate(make_workspace, "return " + KERNEL, init="""
        import ctypes
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        ctypes.CDLL(None).mount(b"none", f"/proc/{pid}".encode(), b"tmpfs", 0, None)
    """)
    verdict = cpu_judge.evaluate(AFFINE, ws)
    if verdict.sandbox.startswith("none"):
        pytest.skip("no sandbox here: the candidate shares the judge's /proc")
    # (strict: since 2026-12-06 the fork itself is refused, before anything can be hidden)
    assert verdict.reward == -1 and ("left processes running" in verdict.error
                                     or "Operation not permitted" in verdict.error), verdict.error


def test_a_done_message_forged_on_the_call_socket_ends_the_call_before_the_work(cpu_judge, make_workspace):
    """The candidate writes `done` for the current call onto the call socket itself, early, then computes: the
    trusted side takes the first `done`, stops the process and reads an output that is not there yet (and the
    harness's own `done` arrives out of turn)."""
    ws = candidate(make_workspace, """
        import json, socket, stat
        out = torch.empty_like(x)
        for fd in map(int, os.listdir("/proc/self/fd")):
            try:
                if stat.S_ISSOCK(os.fstat(fd).st_mode):
                    s = socket.socket(fileno=os.dup(fd))
                    if s.type == socket.SOCK_SEQPACKET and s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE):
                        s.send(json.dumps({"op": "done", "k": self.calls, "outputs": [{"path": "output",
                            "kind": "tensor", "dtype": "float32", "shape": list(out.shape), "strides": [1],
                            "ptr": out.data_ptr()}]}).encode())
            except OSError:
                pass
        self.calls += 1
        out.copy_(""" + KERNEL + """)
        return out""", init="self.calls = 0")
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.reward == -1, verdict.error


def test_work_in_a_signal_handler_on_resume_is_inside_the_window(cpu_judge, make_workspace):
    """A SIGCONT handler that computes when the trusted side resumes the candidate (before the call message): the
    clock starts before the resume."""
    ws = candidate(make_workspace, "return " + KERNEL, init="""
        import signal
        signal.signal(signal.SIGCONT, lambda *a: time.sleep(0.03))
    """)
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert verdict.correct, verdict.error
    assert verdict.times_us["candidate"] >= 30_000 and verdict.reward == 1


def test_hard_coded_literal_sizes_fail_the_extra_shape_check(cache_dir, tmp_path):
    """A task whose get_inputs writes its sizes as literals (`torch.randn(8, 64)`): the batch of 8 is one of the sizes
    that can change, so a candidate that assumes it fails."""
    fixed = tmp_path / "fixed_batch.py"
    fixed.write_text("import torch\nimport torch.nn.functional as F\n\n\nclass ModelNew(torch.nn.Module):\n"
                     "    def __init__(self, features):\n        super().__init__()\n"
                     "        self.linear = torch.nn.Linear(features, features)\n\n"
                     "    def forward(self, x):\n        return F.gelu(self.linear(x.reshape(8, 64)))\n")
    verdict = Judge("cpu", fast_config(cache_dir, policy="kernelbench")).evaluate(TASKS / "linear_gelu.py", fixed)
    # KernelBench has no extra shape: it passes there, and the finding says what the strict judge would do
    assert verdict.correct, verdict.error
    assert any("extra shape (get_inputs line 17: 8->5)" in f for f in verdict.strict_findings), verdict.strict_findings


def test_a_task_with_no_size_to_change_says_so_in_the_verdict(cache_dir, tmp_path):
    task = tmp_path / "fixed_task.py"
    task.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                    "        return x * 2\n\n\ndef get_inputs():\n    return [torch.randn(2, 2)]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    solution = tmp_path / "double.py"
    solution.write_text("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                        "        return x * 2\n")
    verdict = Judge("cpu", fast_config(cache_dir, policy="kernelbench")).evaluate(task, solution)
    assert verdict.correct, verdict.error
    assert any(w.startswith("extra shape not checked") for w in verdict.warnings), verdict.warnings


MASKED = AFFINE.read_text().replace("return torch.relu(x * self.scale + self.shift) * 0.5",
                                   'return torch.relu(x * self.scale + self.shift) * 0.5, torch.full((16,), -math.inf)')


@pytest.mark.parametrize("honest_calls", [None, 7])
def test_outputs_with_infinities_are_checked_like_any_others(cpu_judge, make_workspace, tmp_path, honest_calls):
    """Held out (red team, 2026-12-04): any infinity in the reference's outputs (masked attention scores, a log of
    0) made the judge skip the extra-shape and scaled input sets and never compare a timed call, so a candidate
    honest for its first 7 calls (the verification sets) and returning garbage at once afterwards was correct with
    a 7x speedup, reward 3. An infinity the float64 run shares is part of the answer (compare.unfit); only NaN and
    fp32 overflow leave a check out."""
    task = tmp_path / "affine_masked.py"
    task.write_text("import math\n" + MASKED)
    limit = "True" if honest_calls is None else f"self.calls <= {honest_calls}"
    ws = candidate(make_workspace, f"""
        self.calls += 1
        tail = torch.empty(16).fill_(float("-inf"))
        return ({KERNEL} if {limit} else torch.empty_like(x)), tail
        """, init="self.calls = 0")
    verdict = cpu_judge.evaluate(task, ws)
    assert not any("not checked" in w or "skipped" in w for w in verdict.warnings), verdict.warnings
    if honest_calls is None:
        assert verdict.correct, verdict.error
    else:
        assert not verdict.correct and verdict.error.startswith("incorrect: timed call"), verdict.error


def test_a_kernel_exact_only_on_the_calls_that_verify_fails_the_precision_rule_on_the_timed_ones(cpu_judge,
                                                                                                 make_workspace):
    """Held out (red team, 2026-12-04): the error against fp64 (the precision rule) was measured on the verification
    sets only, which come first: a kernel exact there and 0.5% off on every later call (inside atol/rtol, so the
    checked timed calls passed) was correct; the same kernel off from the first call fails. The checked timed calls
    now bring their errors against fp64 to the rule too."""
    ws = candidate(make_workspace, """
        self.calls += 1
        k = 1.0 if self.calls <= 7 else 1.005
        return cuda_extension.affine_relu_forward(x, self.scale * k, self.shift * k, 0)
        """, init="self.calls = 0")
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert not verdict.correct and verdict.error.startswith("precision: error vs fp64"), verdict.error


def test_an_output_written_again_by_the_next_call_fails_strict_and_is_a_kernelbench_finding(cpu_judge, make_workspace,
                                                                                           cache_dir, tmp_path):
    """Held out (red team, 2026-12-05): ModelNew returns one buffer that it fills again on every call. Each call's
    outputs read right, but a caller that keeps an output (`a = m(x); b = m(y)`) sees `a` change. The harness keeps
    a call's outputs alive through the next call and the trusted side reads them again after it."""
    ws = make_workspace(edits={"kernels/affine_relu_binding.cpp": [(
        "    auto out = torch::empty_like(x);",
        "    static torch::Tensor out;\n"
        "    if (!out.defined() || out.sizes() != x.sizes()) out = torch::empty_like(x);")]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert not verdict.correct and "which its caller still holds, changed during" in verdict.error, verdict.error
    task = tmp_path / "double.py"
    task.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                    "        return x * 2\n\n\ndef get_inputs():\n    return [torch.randn(64, 64)]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    reused = tmp_path / "reused.py"
    reused.write_text("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def __init__(self):\n"
                      "        super().__init__()\n        self.out = None\n\n    def forward(self, x):\n"
                      "        if self.out is None or self.out.shape != x.shape:\n"
                      "            self.out = torch.empty_like(x)\n"
                      "        return torch.mul(x, 2, out=self.out)\n")
    verdict = Judge("cpu", fast_config(cache_dir, policy="kernelbench")).evaluate(task, reused)
    assert verdict.correct, verdict.error  # (KernelBench never keeps an output across calls)
    assert any("which its caller still holds, changed during this call" in f for f in verdict.strict_findings), \
        verdict.strict_findings



def test_a_kernelbench_candidate_wrong_on_timed_calls_is_credited_no_speed(cache_dir, tmp_path):
    """Held out (red team, 2026-12-05): under the kernelbench policy a candidate right on KernelBench's known trial
    inputs and wrong on every timed call (uninitialised outputs, microseconds) got reward 3 and fast_p 100%: the
    judge had found the timed calls wrong but only as strict findings. A speed measured on wrong outputs is not
    credited: correct by KernelBench's rule, reward 1, no speedups."""
    task = tmp_path / "double.py"
    task.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                    "        return x * 2\n\n\ndef get_inputs():\n    return [torch.randn(256, 1024)]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    lazy = tmp_path / "lazy.py"
    lazy.write_text("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def __init__(self):\n"
                    "        super().__init__()\n        self.calls = 0\n\n    def forward(self, x):\n"
                    "        self.calls += 1\n        return x * 2 if self.calls <= 5 else torch.empty_like(x)\n")
    verdict = Judge("cpu", fast_config(cache_dir, policy="kernelbench")).evaluate(task, lazy)
    assert verdict.correct and verdict.reward == 1, (verdict.error, verdict.reward)
    assert verdict.speedup_vs_eager is None and verdict.speedup_vs_compile is None
    assert verdict.reason.startswith("no speedup credited") and verdict.timing["baselines"]["wrong_timed_calls"] >= 1
    assert any(f.startswith("incorrect: timed call") for f in verdict.strict_findings), verdict.strict_findings
