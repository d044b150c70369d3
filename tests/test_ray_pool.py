"""The judge pool on Ray actors (the cpu backend on a local Ray instance): the same verdicts as a lone judge, tasks
that travel by content, a reference error raised as in `Judge.evaluate`."""

import dataclasses

import pytest
import ray

from conftest import CANDIDATES, TASKS, fast_config
from cuda_agent.judge.ray_pool import RayJudgePool
from cuda_agent.task import TaskError, load_task

AFFINE = TASKS / "affine_relu.py"


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_actors_judge_as_the_local_pool_does(local_ray, cache_dir, make_workspace, tmp_path):
    wrong = make_workspace(edits={"kernels/affine_relu.cpp": [("* 0.5f;", "* 0.55f;")]})
    elsewhere = dataclasses.replace(load_task(AFFINE), path=tmp_path / "on_another_node" / "affine_relu.py")
    with RayJudgePool("cpu", fast_config(cache_dir), workers=2) as pool:
        futures = [pool.submit(AFFINE, CANDIDATES / "affine_relu_ok"), pool.submit(AFFINE, wrong),
                   pool.submit(elsewhere, CANDIDATES / "affine_relu_single.py"),
                   pool.submit(TASKS / "broken" / "bad_inputs.py", CANDIDATES / "affine_relu_ok")]
        ok, bad, moved = (f.result(timeout=900) for f in futures[:3])
        with pytest.raises(TaskError, match="get_inputs"):
            futures[3].result(timeout=900)
    assert ok.correct and ok.reward >= 1 and ok.task["path"] == str(AFFINE.resolve()), ok.error
    assert not bad.correct and bad.error.startswith("incorrect"), bad.error
    assert moved.correct and moved.task["path"] == str(elsewhere.path), moved.error  # the actor wrote it locally
    assert not pool.actors


def test_the_agent_and_the_warmup_reward_judge_on_ray_actors(local_ray, cache_dir, monkeypatch):
    from cuda_agent.agent.environment import Environment
    from cuda_agent.judge import pool as pools
    from cuda_agent.rl.demo import candidate_files
    from cuda_agent.rl.verl_data import verl_rows
    from cuda_agent.rl.verl_reward import compute_score
    from cuda_agent.workspace.candidate import load_candidate

    with RayJudgePool("cpu", fast_config(cache_dir), workers=2) as pool:
        monkeypatch.setitem(pools._shared, ("cpu", (), "ray"), pool)  # what shared_pool("cpu", judge="ray") gives
        assert pool.backend.name == "cpu" and pool.private_paths == [cache_dir.resolve()]
        built = pool.compile(load_candidate(CANDIDATES / "affine_relu_ok"))  # the agent's compile tool, on an actor
        assert built.ok and built.steps, built.error
        Environment(pool, cache_dir / "agent-run", use_sandbox=pool.sandboxed).reset(AFFINE)
        [row] = verl_rows([AFFINE], "cpu", single_turn=True, judge="ray")
        reply = "\n\n".join(f"### FILE: {path}\n```\n{content}\n```"
                            for path, content in candidate_files("cpu", ["A"]).items())
        result = compute_score("cuda_agent", reply, "", row["extra_info"])
        assert result["score"] >= 1 and result["correct"], result
