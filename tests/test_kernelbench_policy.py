"""`--policy kernelbench` follows KernelBench's protocol (judge/kernelbench.py): seeded construction instead of a
state dict, its trial seeds, inputs and rule decide; what the strict judge would add is `strict_findings`."""

import torch

from conftest import TASKS, fast_config
from cuda_agent.judge import Judge, kernelbench

LINEAR_GELU = TASKS / "linear_gelu.py"


def candidate(folder, name: str, init: str) -> str:
    path = folder / f"{name}.py"
    path.write_text("import torch\nimport torch.nn.functional as F\n\n\nclass ModelNew(torch.nn.Module):\n"
                    f"    def __init__(self, features):\n        super().__init__()\n{init}\n"
                    "    def forward(self, x):\n        return F.gelu(x @ self.w.t() + self.b)\n")
    return path


def test_trial_seeds_are_drawn_from_the_one_seed_as_kernelbench_draws_them():
    seeds = kernelbench.trial_seeds()
    torch.manual_seed(42)
    assert seeds == [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(5)]
    assert len(set(seeds)) == 5 and kernelbench.trial_seeds(trials=2) == seeds[:2]
    assert kernelbench.trial_seeds(7) != seeds


def test_seeded_construction_gives_the_same_weights_whatever_their_names_and_inputs_are_made_on_the_cpu():
    class A(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.linear = torch.nn.Linear(n, n)

    class B(torch.nn.Module):  # the same parameters, created in the same order, under other names
        def __init__(self, n):
            super().__init__()
            self.weight_matrix = torch.nn.Parameter(torch.empty(n, n))
            self.bias_vector = torch.nn.Parameter(torch.empty(n))
            torch.nn.init.kaiming_uniform_(self.weight_matrix, a=5 ** 0.5)
            torch.nn.init.uniform_(self.bias_vector, -n ** -0.5, n ** -0.5)

    a, b = kernelbench.construct(A, [8], "cpu"), kernelbench.construct(B, [8], "cpu")
    assert torch.equal(a.linear.weight, b.weight_matrix) and torch.equal(a.linear.bias, b.bias_vector)
    first = kernelbench.inputs(lambda: [torch.randn(3, 4)], 123, "cpu")
    kernelbench.set_seed(123)
    assert torch.equal(first[0], torch.randn(3, 4))


def test_kernelbench_s_rule_shapes_dtypes_and_non_finite_values():
    ref = torch.tensor([1.0, float("inf"), 2.0])
    assert kernelbench.compare(ref, ref.clone()) is None  # the same infinity is equal
    assert "mismatch" in kernelbench.compare(ref, torch.tensor([1.0, float("nan"), 2.0]))
    assert kernelbench.compare(ref, ref[:2]).startswith("Output shape mismatch")
    assert "allclose raised" in kernelbench.compare(ref, ref.double())
    # allclose scales rtol by the candidate's value: |1 - 1.0199| <= 0.01 + 0.01 * 1.0199
    assert kernelbench.compare(torch.tensor([1.0]), torch.tensor([1.0199])) is None
    assert kernelbench.compare(torch.tensor([1.0]), torch.tensor([1.03])) is not None


def test_a_candidate_with_its_own_parameter_names_passes_kernelbench_and_says_why_strict_would_not(
        cache_dir, tmp_path):
    renamed = candidate(tmp_path, "renamed", "        self.w = torch.nn.Parameter(torch.empty(features, features))\n"
                        "        self.b = torch.nn.Parameter(torch.empty(features))\n"
                        "        torch.nn.init.kaiming_uniform_(self.w, a=5 ** 0.5)\n"
                        "        torch.nn.init.uniform_(self.b, -features ** -0.5, features ** -0.5)\n")
    with Judge("cpu", fast_config(cache_dir, policy="kernelbench")) as judge:
        verdict = judge.evaluate(LINEAR_GELU, renamed)
        assert verdict.correct and verdict.reward >= 1, verdict.error
        assert verdict.seeds == kernelbench.trial_seeds()
        assert any("does not take Model's state dict (strict would fail): missing: linear.bias, linear.weight; "
                   "unexpected: b, w" in f for f in verdict.strict_findings), verdict.strict_findings
        # the same parameters drawn in another order hold other weights: wrong, as KernelBench finds it
        swapped = candidate(tmp_path, "swapped", "        self.b = torch.nn.Parameter(torch.empty(features))\n"
                            "        self.w = torch.nn.Parameter(torch.empty(features, features))\n"
                            "        torch.nn.init.uniform_(self.b, -features ** -0.5, features ** -0.5)\n"
                            "        torch.nn.init.kaiming_uniform_(self.w, a=5 ** 0.5)\n")
        wrong = judge.evaluate(LINEAR_GELU, swapped)
        assert not wrong.correct and "Output mismatch" in wrong.error, wrong.error
    # (the strict judge refuses such a candidate: test_judge_cpu's state-dict test)


def test_kernelbench_s_timing_loops_call_warm_up_discard_and_keep_as_each_revision_does():
    calls = []
    current, first = kernelbench.TIMINGS["kernelbench"], kernelbench.TIMINGS["kernelbench-v0.1"]
    times = kernelbench.time_calls(lambda x: calls.append(x), [1], current, "cpu")
    assert len(times) == 100 and len(calls) == 3 + 1 + 100 and all(t >= 0 for t in times)
    calls.clear()
    assert len(kernelbench.time_calls(lambda x: calls.append(x), [1], current, "cpu", reference=True)) == 100
    assert len(calls) == 5 + 1 + 100  # measure_ref_program_time warms up 5 times
    calls.clear()
    kernelbench.time_calls(lambda x: calls.append(x), [1], first, "cpu")
    assert len(calls) == 3 + 100 and not first.flush_l2 and current.flush_l2
    stats = kernelbench.timing_stats([1.0, 3.0])
    assert stats == {"mean": 2.0, "std": 1.0, "min": 1.0, "max": 3.0, "num_trials": 2}
    from cuda_agent.judge.config import TIMINGS
    assert set(TIMINGS) == {"ours", *kernelbench.TIMINGS}


def test_kernelbench_timing_is_reported_beside_the_judge_s_and_a_candidate_that_fakes_it_gains_nothing(
        cache_dir, tmp_path):
    """KernelBench times ModelNew inside the candidate's process: a candidate can fake that number (here it
    replaces the timing loop when imported), so it is reported as the candidate's and the verdict ignores it; one
    whose process ends there keeps its verdict, and the timing says what happened."""
    honest = candidate(tmp_path, "honest", "        self.linear = torch.nn.Linear(features, features)\n"
                       "        self.w, self.b = self.linear.weight, self.linear.bias\n")
    faker = tmp_path / "faker.py"
    faker.write_text(honest.read_text() + "\n\nfrom cuda_agent.judge import kernelbench as _kb\n"
                     "_kb.time_calls = lambda *args, **kwargs: [1e-9] * 100\n")
    quitter = tmp_path / "quitter.py"  # its process ends when KernelBench's timing starts
    quitter.write_text(honest.read_text() + "\n\nimport os\nfrom cuda_agent.judge import kernelbench as _kb\n"
                       "_kb.time_calls = lambda *args, **kwargs: os._exit(3)\n")
    with Judge("cpu", fast_config(cache_dir, policy="kernelbench", timing="kernelbench")) as judge:
        v = judge.evaluate(LINEAR_GELU, faker)
        ended = judge.evaluate(LINEAR_GELU, quitter)
    assert ended.correct and ended.times_us["candidate"], ended.error  # the verdict stands
    assert "candidate process" in ended.kernelbench_timing["error"], ended.kernelbench_timing
    assert v.correct and v.times_us["candidate"], v.error
    kb = v.kernelbench_timing
    assert kb["method"] == "kernelbench" and "candidate's own process" in kb["measured"], kb
    assert kb["speedup_vs_eager"] > 1e4 and kb["candidate_ms"] < 1e-8  # what the candidate's process said
    assert kb["stats_ms"]["eager"]["num_trials"] == 100 and 1e-4 < kb["eager_ms"] < 1e3  # the reference's, real
    assert kb["compile_ms"] > 1e-4 or kb["compile_error"], kb
    assert v.times_us["eager"] / v.times_us["candidate"] < 100 and "kernelbench_timing" in v.phases_s  # our clock
