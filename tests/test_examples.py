"""The examples/ suite a fresh clone runs (README): every task is a KernelBench-format task the judge loads and
eval-suite finds, each with a solution workspace, and a solution is judged correct on the cpu backend."""

import pytest

from cuda_agent.suite.evaluate import discover, find_solution
from cuda_agent.task import load_task, shape_constants
from cuda_agent.workspace.candidate import load_candidate

from conftest import ROOT

EXAMPLES = ROOT / "examples"
SOLUTIONS = EXAMPLES / "solutions"


def test_every_example_task_loads_and_has_a_solution():
    tasks = discover(EXAMPLES)
    assert {t.level for t in tasks} == {"level1", "level2"} and len(tasks) >= 3
    for task in tasks:
        loaded = load_task(task.path)
        assert shape_constants(loaded.source), f"{task.name}: no size the extra-shape check can change"
        solution = find_solution(SOLUTIONS, task)
        assert solution is not None and solution.is_dir(), f"{task.name}: no solution workspace"
        candidate = load_candidate(solution)
        assert candidate.missing_model_new() is None and any(f.startswith("kernels/") for f in candidate.files)


@pytest.mark.parametrize("name", ["level2/1_Linear_Bias_GELU"])
def test_an_example_solution_is_judged_correct_on_the_cpu(cpu_judge, name):
    verdict = cpu_judge.evaluate(EXAMPLES / f"{name}.py", SOLUTIONS / name)
    assert verdict.correct and verdict.reward >= 1, verdict.error
    assert not verdict.policy_violations


def test_training_on_the_examples_folder_takes_its_tasks_not_its_solutions(tmp_path):
    from cuda_agent.task import task_files

    tasks = task_files(EXAMPLES, tmp_path)
    assert tasks == [t.path for t in discover(EXAMPLES)] and all(p.parent.parent == EXAMPLES for p in tasks)
