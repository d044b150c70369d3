"""The warm-up's reward in verl's compute_score form: a reply judged as the single-turn episode judges it."""

import pytest

from conftest import TASKS, fast_config
from cuda_agent.judge import pool as pools
from cuda_agent.judge.pool import JudgePool
from cuda_agent.rl.demo import candidate_files
from cuda_agent.rl.verl_data import verl_rows
from cuda_agent.rl.verl_reward import compute_score


@pytest.fixture
def cpu_pool(cache_dir, monkeypatch):
    with JudgePool("cpu", fast_config(cache_dir)) as pool:
        monkeypatch.setitem(pools._shared, ("cpu", (), "local"), pool)  # what shared_pool("cpu") hands out
        yield pool


def test_a_reply_with_every_file_scores_its_milestone_reward_and_one_without_scores_minus_one(cpu_pool):
    [row] = verl_rows([TASKS / "affine_relu.py"], "cpu", single_turn=True)
    assert "### FILE:" in row["prompt"][-1]["content"]  # the warm-up's request, as the agent's loop sends it
    reply = "Here it is.\n\n" + "\n\n".join(f"### FILE: {path}\n```\n{content}\n```"
                                            for path, content in candidate_files("cpu", ["A"]).items())
    result = compute_score("cuda_agent", reply, "", row["extra_info"])
    assert result["score"] >= 1 and result["correct"], result
    result = compute_score("cuda_agent", "I would vectorise the loads.", "", row["extra_info"])
    assert result["score"] == -1 and result["stop"] == "no files" and "no `### FILE:` blocks" in result["stop_detail"]
    with pytest.raises(ValueError, match="reference"):
        compute_score("cuda_agent", reply, "", {})
