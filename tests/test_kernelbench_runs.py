"""eval-suite reads KernelBench's generation folders and reports its fast_p and, under the kernelbench policy, what
the strict judge would add (suite/kernelbench_runs.py); judged here by a stand-in pool (the judge is tested
elsewhere)."""

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from cuda_agent.judge import Verdict
from cuda_agent.judge.store import Store
from cuda_agent.suite import kernelbench_runs
from cuda_agent.suite.evaluate import discover, evaluate_suite, measurement_key, report
from cuda_agent.task import load_task

TASK = "import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n\n\n" \
       "def get_inputs():\n    return [torch.randn(4)]\n\n\ndef get_init_inputs():\n    return []\n"


class VerdictsByComment:
    """A pool whose verdict is written in the solution itself: `# reward R speedup S findings F1|F2`."""

    backend = SimpleNamespace(name="cpu", identity=lambda: "test", machine=lambda: "test", timing_method="trusted")
    config = SimpleNamespace(verdict_key=lambda: "test")

    def __init__(self):
        self.judged = []

    def submit(self, task, cand) -> Future:
        self.judged.append(cand.origin.name)
        words = cand.text()["model_new.py"].split("\n")[0].split()
        reward, speedup = int(words[2]), float(words[4])
        findings = words[6].split("|") if len(words) > 6 else []
        future = Future()
        future.set_result(Verdict(reward=reward, compiled=True, correct=reward >= 1, policy="kernelbench",
                                  speedup_vs_eager=speedup if reward >= 1 else None,
                                  speedup_vs_compile=speedup / 2 if reward >= 1 else None,
                                  strict_findings=[f.replace("_", " ") for f in findings]))
        return future


def three_tasks_and_a_generation_folder(tmp_path):
    """A suite of three level-1 tasks, and an empty generation folder beside it."""
    suite = tmp_path / "suite" / "level1"
    suite.mkdir(parents=True)
    for name in ("1_Copy.py", "2_Copy.py", "3_Copy.py"):
        (suite / name).write_text(TASK)
    runs = tmp_path / "generations"
    runs.mkdir()
    return suite, runs


def test_a_generation_folder_is_judged_sample_by_sample_with_fast_p_and_strict_findings(tmp_path):
    suite, runs = three_tasks_and_a_generation_folder(tmp_path)
    samples = {(1, 0): "1 speedup 1.6 findings extra_shape_(x)|modified_in_place", (1, 1): "3 speedup 2.5",
               (2, 0): "-1 speedup 0", (2, 3): "2 speedup 1.2", (7, 0): "3 speedup 9"}  # problem 7: not in the suite
    for (problem, sample), comment in samples.items():
        (runs / f"level_1_problem_{problem}_sample_{sample}_kernel.py").write_text(
            f"# reward {comment}\nclass ModelNew:\n    pass\n")
    assert kernelbench_runs.is_generation_folder(runs) and not kernelbench_runs.is_generation_folder(suite)
    pool = VerdictsByComment()
    records = evaluate_suite(pool, discover(tmp_path / "suite"), runs, Store(tmp_path / "store.sqlite"))
    assert [(r["task"], r["sample"]) for r in records] == [("level1/1_Copy.py", 0), ("level1/1_Copy.py", 1),
                                                           ("level1/2_Copy.py", 0), ("level1/2_Copy.py", 3),
                                                           ("level1/3_Copy.py", 0)]
    assert "no level_1_problem_3_sample_S_kernel.py" in records[-1]["verdict"]["error"]
    assert records[0]["task_hash"] == load_task(suite / "1_Copy.py").hash  # which revision of the suite was judged
    rep = report(records)
    first = rep["overall"]  # each problem's first sample: 1 (1.6x), 2 (wrong), 3 (missing)
    assert first["n"] == 3 and first["pass_rate"] == 1 / 3
    assert first["fast_p_vs_eager"] == {"fast_0": 1 / 3, "fast_0.5": 1 / 3, "fast_0.8": 1 / 3, "fast_1": 1 / 3,
                                        "fast_1.5": 1 / 3, "fast_2": 0.0}
    assert first["fast_p_vs_compile"]["fast_0.5"] == 1 / 3 and first["fast_p_vs_compile"]["fast_1"] == 0.0
    assert first["strict"] == {"pass_rate": 1 / 3, "pass_rate_without_findings": 0.0,
                               "findings_by_kind": {"extra shape": 1, "input changed in place": 1}}
    assert rep["best_samples"] == {"level1/1_Copy.py": 1, "level1/2_Copy.py": 3, "level1/3_Copy.py": 0}
    assert rep["best_of_samples"]["level1"]["pass_rate"] == 2 / 3
    assert rep["best_of_samples"]["level1"]["strict"]["pass_rate_without_findings"] == 2 / 3
    # the page: both rules' pass rates per level, the findings that separate them, fast_p, each task's hash
    import json

    from cuda_agent.report import write_report

    (tmp_path / "report.json").write_text(json.dumps(rep))
    page = write_report(tmp_path / "report.json", tmp_path / "page.html")[0].read_text()
    assert "rules and the strict judge" in page and "findings among KernelBench" in page
    assert ">33.3%<" in page and ">0.0%<" in page and "1 extra shape; 1 input changed in place" in page
    assert "fast_1.5" in page and records[0]["task_hash"][:12] in page
    assert rep["suite_revision"]["tasks"] == 3 and rep["suite_revision"]["kernelbench_files"] == 0
    assert "none is a KernelBench file of any revision" in page
    # resumed: nothing judged again
    again = VerdictsByComment()
    assert evaluate_suite(again, discover(tmp_path / "suite"), runs, Store(tmp_path / "store.sqlite")) == records
    assert again.judged == []


def test_kernelbench_s_timing_is_set_beside_the_judge_s_per_level_in_the_report_and_on_the_page(tmp_path):
    def verdict(reward, ours, theirs, error=None):
        kb = {"method": "kernelbench", "speedup_vs_eager": theirs, "speedup_vs_compile": theirs and theirs / 2,
              "error": error} if reward >= 1 else {}
        return Verdict(reward=reward, compiled=True, correct=reward >= 1, speedup_vs_eager=ours,
                       speedup_vs_compile=ours and ours / 4, kernelbench_timing=kb).to_dict()
    records = [{"level": "level1", "task": f"level1/{i}_T.py", "sample": None, "verdict": v}
               for i, v in enumerate([verdict(3, 2.0, 4.0), verdict(2, 1.0, 1.0), verdict(1, 0.5, None, "boom"),
                                      verdict(-1, None, None)])]
    rep = report(records)
    kb = rep["overall"]["kernelbench_timing"]
    assert kb["method"] == "kernelbench" and kb["timed"] == 2 and kb["failed"] == 1
    assert abs(kb["geomean_speedup_vs_eager"] - 2.0) < 1e-9  # sqrt(4 * 1)
    assert abs(kb["geomean_speedup_vs_eager_ours"] - 2 ** 0.5) < 1e-9
    assert kb["median_ratio_eager"] == 1.5 and kb["median_ratio_compile"] == 3.0  # (4/2 + 1/1) / 2; ours / 4
    assert kb["fast_p_vs_eager"]["fast_1.5"] == 0.25 and kb["fast_p_vs_eager"]["fast_0.5"] == 0.5  # of all 4
    assert "kernelbench_timing" not in report(records[3:])["overall"]
    import json

    from cuda_agent.report import write_report

    (tmp_path / "report.json").write_text(json.dumps(rep))
    page = write_report(tmp_path / "report.json", tmp_path / "page.html")[0].read_text()
    assert "timing and the judge" in page and "x eager (KB timing)" in page and ">4.00x<" in page


def test_finding_kinds_name_what_the_strict_judge_would_have_failed():
    found = kernelbench_runs.finding_kinds([
        "ModelNew does not take Model's state dict (strict would fail): missing: w",
        "incorrect: extra shape (N: 8->5): out: 3+ of 40 elements outside atol=0.01",
        "incorrect: input set 0: out: relative error 0.9 (||out - ref|| / ||ref||)",
        "precision: error vs fp64 is 20000x fp32 eager's", "something new"])
    assert found == ["state dict", "extra shape", "outputs outside the judge's rule", "precision", "other"]


def test_a_task_file_is_placed_in_kernelbench_s_history_by_its_git_hash(tmp_path, monkeypatch):
    """revisions.py: a file's git blob hash (as `git hash-object` gives it) finds the dates its content was current;
    over a suite, the dates every task was current at once, or that they never were."""
    import subprocess

    from cuda_agent.suite import revisions

    old, new, other = (tmp_path / name for name in ("old.py", "new.py", "other.py"))
    old.write_text(TASK)
    new.write_text(TASK.replace("randn(4)", "randn(8)"))
    other.write_text(TASK.replace("randn(4)", "randn(16)"))
    git = subprocess.run(["git", "hash-object", str(old)], capture_output=True, text=True, check=True).stdout.strip()
    assert revisions.blob_hash(old.read_bytes()) == git
    fake = {"source": "KB", "head": "abcdef1234567", "head_date": "2026-01-19", "files": {
        git: ["level1/1_Copy.py", "2024-10-24", "2025-07-14", False],
        revisions.blob_hash(new.read_bytes()): ["level1/1_Copy.py", "2025-07-17", "2026-01-19", True]}}
    monkeypatch.setattr(revisions, "table", lambda: fake)
    assert revisions.lookup(old) == {"path": "level1/1_Copy.py", "from": "2024-10-24", "to": "2025-07-14",
                                     "current": False}
    assert revisions.lookup(other) is None
    together = revisions.summarise([revisions.lookup(new), revisions.lookup(other)])
    assert together["kernelbench_files"] == 1 and together["unknown"] == 1 and together["newest_revision"] == 1
    assert together["all_current_between"] == ["2025-07-17", "2026-01-19"]
    assert revisions.summarise([revisions.lookup(old), revisions.lookup(new)])["all_current_between"] is None


def test_the_packaged_revision_table_covers_kernelbench_s_levels():
    """The table shipped in the package (scripts/kernelbench_revisions.py over a clone): every version of the
    problem files of levels 1-3 at least, each with its dates in order; where this machine holds the benchmark's
    files (../shared/kernelbench), every one of them is found."""
    from pathlib import Path

    from cuda_agent.suite import revisions

    files = revisions.table()["files"]
    assert len(files) > 750
    assert {path.split("/")[0] for path, *_ in files.values()} >= {"level1", "level2", "level3"}
    assert all(first <= last for _, first, last, _ in files.values())
    shared = Path(__file__).resolve().parents[2] / "shared" / "kernelbench"
    for task in sorted(shared.glob("level*/*.py")):
        assert revisions.lookup(task) is not None, task


def test_kernelbench_s_published_results_of_the_run_are_set_beside_the_verdicts_here(tmp_path, capsys):
    """A generation folder with KernelBench's own `eval_results.json`: each sample's published verdict goes into its
    record, and per level the report counts where the judge agrees (and names where it does not)."""
    import json

    suite, runs = three_tasks_and_a_generation_folder(tmp_path)
    for problem, comment in ((1, "3 speedup 2.0"), (2, "-1 speedup 0"), (3, "2 speedup 1.2")):
        (runs / f"level_1_problem_{problem}_sample_0_kernel.py").write_text(f"# reward {comment}\n")
    a100 = {"hardware": "NVIDIA A100-SXM4-40GB"}
    (runs / "eval_results.json").write_text(json.dumps({  # the first release's form (one entry), then the newer list
        "1": {"sample_id": 0, "compiled": True, "correctness": True, "metadata": a100, "runtime": 0.5},
        "2": [{"sample_id": 0, "compiled": True, "correctness": True, "metadata": a100, "runtime": 1.0}],
        "3": [{"sample_id": 0, "compiled": False, "correctness": False, "metadata": a100, "runtime": -1.0}]}))
    records = evaluate_suite(VerdictsByComment(), discover(tmp_path / "suite"), runs, Store(tmp_path / "s.sqlite"))
    for r in records:  # the stand-in pool gives no times; the judge's candidate time, 250 us for problem 1
        r["verdict"]["times_us"] = {"candidate": 250.0} if r["verdict"]["correct"] else None
    assert [r["published"]["correct"] for r in records] == [True, True, False]
    dummy = runs / "level_9_problem_999_sample_0_kernel.py"  # a problem of no suite: it once hid the comparison
    dummy.write_text("# reward 3 speedup 1\n")
    again = evaluate_suite(VerdictsByComment(), discover(tmp_path / "suite"), runs, Store(tmp_path / "s.sqlite"))
    assert [r["published"]["correct"] for r in again] == [True, True, False]
    dummy.unlink()
    assert records[0]["published"]["runtime_ms"] == 0.5 and records[2]["published"]["runtime_ms"] is None
    rep = report(records)
    pub = rep["published"]["level1"]
    assert pub["n"] == 3 and pub["agree"] == 1 and pub["pass_rate_published"] == 2 / 3
    assert [(d["task"], d["published"], d["here"]) for d in pub["disagree"]] == [
        ("level1/2_Copy.py", True, False), ("level1/3_Copy.py", False, True)]
    assert pub["hardware"] == ["NVIDIA A100-SXM4-40GB"] and pub["median_runtime_ratio"] == 2.0  # 500 us / 250
    from cuda_agent.report import write_report

    (tmp_path / "report.json").write_text(json.dumps(rep))
    page = write_report(tmp_path / "report.json", tmp_path / "page.html")[0].read_text()
    assert "published results and the verdicts here" in page and "2_Copy.py (published correct)" in page
    assert "correct, 0.5 ms" in page
    from cuda_agent.cli.common import print_report

    print_report(rep, "suite", as_json=False)
    said = " ".join(capsys.readouterr().out.split())
    assert "level1: KernelBench's published results (NVIDIA A100-SXM4-40GB) agree on 1 of 3" in said
    assert "differ: 2_Copy.py, 3_Copy.py" in said
    # samples of two levels in one folder: the file's problem ids say no level, so nothing is read from it
    assert kernelbench_runs.published_results(runs, 1, {1})
    assert kernelbench_runs.published_results(runs, 1, {1, 2}) == {}  # samples of two levels judged: no level


def test_sample_0_is_sample_0_and_other_spellings_of_a_sample_are_not_read(tmp_path):
    """Held out (red team, 2026-12-05): `sample_00`, `problem_01` or Unicode digits were read as sample 0 and sorted
    before it, replacing a failing sample 0 (pass rate 100% instead of 50%); a missing sample 0 let the next sample
    present stand in for it; two tasks of one problem number were both credited with its samples."""
    suite, runs = three_tasks_and_a_generation_folder(tmp_path)
    for name, comment in {"level_1_problem_1_sample_0": "-1 speedup 0", "level_1_problem_1_sample_00": "3 speedup 2",
                          "level_1_problem_01_sample_0": "3 speedup 2",
                          "level_1_problem_\uff11_sample_0": "3 speedup 2",
                          "level_1_problem_2_sample_3": "3 speedup 2"}.items():
        (runs / f"{name}_kernel.py").write_text(f"# reward {comment}\nclass ModelNew:\n    pass\n")
    records = evaluate_suite(VerdictsByComment(), discover(tmp_path / "suite"), runs, Store(tmp_path / "s.sqlite"))
    assert [(r["task"], r["sample"], bool(r["solution"])) for r in records] == [
        ("level1/1_Copy.py", 0, True), ("level1/2_Copy.py", 0, False), ("level1/2_Copy.py", 3, True),
        ("level1/3_Copy.py", 0, False)]
    assert records[0]["solution"].endswith("level_1_problem_1_sample_0_kernel.py")
    assert report(records)["overall"]["pass_rate"] == 0.0  # over sample 0 of each problem
    (suite / "1_CopyAgain.py").write_text(TASK)
    with pytest.raises(ValueError, match="both problem 1 of level1"):
        evaluate_suite(VerdictsByComment(), discover(tmp_path / "suite"), runs, Store(tmp_path / "s.sqlite"))


def test_published_results_and_the_candidate_s_own_timing_are_read_only_when_shaped_as_kernelbench_writes_them(
        tmp_path):
    """Held out (red team, 2026-12-05): entries of `eval_results.json` of other types crashed eval-suite after all the
    judging (nothing stored), `Infinity` went into --json, a rewritten file was not read again (cached by path), and
    a candidate's forged KernelBench timing (no trials, negative times) aborted the run or poisoned the database."""
    import json

    from cuda_agent.judge.kernelbench_timing import plausible

    _, runs = three_tasks_and_a_generation_folder(tmp_path)
    (runs / "level_1_problem_1_sample_0_kernel.py").write_text("# reward 1 speedup 1\n")
    results = runs / "eval_results.json"
    results.write_text('{"1": [{"sample_id": "zero", "correctness": true}, {"sample_id": 0, "correctness": true, '
                       '"metadata": "H100", "runtime": Infinity}], "2": {"sample_id": 0, "correctness": "false"}, '
                       '"3": [{"sample_id": 0, "correctness": false, "runtime_stats": {"hardware": ["H100"]}}], '
                       '"x": [{"sample_id": 0, "correctness": true}]}')
    assert kernelbench_runs.published_results(runs, 1, {1}) == {
        (1, 1, 0): {"correct": True, "compiled": False, "runtime_ms": None, "hardware": None},
        (1, 3, 0): {"correct": False, "compiled": False, "runtime_ms": None, "hardware": "['H100']"}}
    results.write_text(json.dumps({"2": [{"sample_id": 0, "correctness": True, "runtime": 0.5}]}))
    assert kernelbench_runs.published_results(runs, 1, {1}) == {
        (1, 2, 0): {"correct": True, "compiled": False, "runtime_ms": 0.5, "hardware": None}}
    results.write_text('{"1": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert kernelbench_runs.published_results(runs, 1, {1}) == {}
    assert kernelbench_runs.geomean([2.0, -1.0, float("inf"), 8.0]) == 4.0
    assert plausible([1.0, 2.0], 100) and not plausible([], 100) and not plausible([-1.0], 100)
    assert not plausible([float("nan")], 100) and not plausible([1.0] * 101, 100) and not plausible("1", 100)


class Raising(VerdictsByComment):
    """A stand-in pool whose every evaluation raises `error`."""

    def __init__(self, error: Exception):
        super().__init__()
        self.error = error

    def submit(self, task, cand) -> Future:
        future = Future()
        future.set_exception(self.error)
        return future


def test_a_failure_of_the_judge_on_one_solution_is_that_solution_s_verdict_and_is_not_stored(tmp_path):
    """Held out (red team, 2026-12-05): an exception out of one evaluation (a forged timing once raised
    ZeroDivisionError) aborted the whole suite; now it is that sample's failure, judged again next run."""
    suite, runs = three_tasks_and_a_generation_folder(tmp_path)
    (runs / "level_1_problem_1_sample_0_kernel.py").write_text("# reward 3 speedup 2\n")
    store = Store(tmp_path / "s.sqlite")
    records = evaluate_suite(Raising(ZeroDivisionError("division by zero")), discover(tmp_path / "suite"), runs, store)
    assert "the judge failed on this solution: ZeroDivisionError" in records[0]["verdict"]["error"]
    assert evaluate_suite(VerdictsByComment(), discover(tmp_path / "suite"), runs, store)[0]["verdict"]["reward"] == 3


def test_a_reference_that_fails_here_is_counted_apart_and_judged_again_next_run(tmp_path, capsys):
    """Measured on the H200 (2026-12-07, 14 evaluations at once): KernelBench's batched matmul reference failed with
    CUBLAS_STATUS_INTERNAL_ERROR, and the stored failure would have stood for the solution on every rerun. A
    reference's failure (TaskError) is the task's or the machine's: counted in `reference_errors`, not stored."""
    import json

    from cuda_agent.cli.common import print_report
    from cuda_agent.task import TaskError

    suite, runs = three_tasks_and_a_generation_folder(tmp_path)
    (runs / "level_1_problem_1_sample_0_kernel.py").write_text("# reward 3 speedup 2\n")
    store = Store(tmp_path / "s.sqlite")
    failing = Raising(TaskError("Model.forward failed: CUDA error: CUBLAS_STATUS_INTERNAL_ERROR"))
    records = evaluate_suite(failing, discover(tmp_path / "suite"), runs, store)
    assert records[0]["verdict"]["error"].startswith("reference error: Model.forward failed")
    rep = report(records)
    assert rep["overall"]["reference_errors"] == 1 and rep["overall"]["pass_rate"] == 0
    print_report(rep, "suite", as_json=False)
    assert "1 task(s) whose reference failed here" in " ".join(capsys.readouterr().out.split())
    from cuda_agent.report import write_report

    (tmp_path / "report.json").write_text(json.dumps(rep))
    assert "reference failed here" in write_report(tmp_path / "report.json", tmp_path / "page.html")[0].read_text()
    assert evaluate_suite(VerdictsByComment(), discover(tmp_path / "suite"), runs, store)[0]["verdict"]["reward"] == 3


def test_stored_suite_verdicts_depend_on_the_clock_that_timed_them(monkeypatch):
    """Held out (red team, 2026-12-05): a suite judged with CUDA_AGENT_GPU_CLOCK=in-process (a clock the candidate
    can fool) left verdicts a later run with the trusted clock resumed as its own."""
    trusted, in_process = VerdictsByComment(), VerdictsByComment()
    in_process.backend = SimpleNamespace(**{**vars(VerdictsByComment.backend), "timing_method": "in-process"})
    assert measurement_key(trusted) != measurement_key(in_process)
    before = measurement_key(trusted)
    monkeypatch.setenv("CUDA_AGENT_CALL_STREAM", "legacy")
    assert measurement_key(trusted) != before
