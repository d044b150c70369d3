"""The four stages as verl runs: configurations composed from verl's own files and validated by its own code, the
agent loop importable from the file they name, and the data loading with verl's dataset classes."""

import json
import shutil

import pytest

pytest.importorskip("verl", reason="the `train` extra (verl) is not installed")

from omegaconf import OmegaConf  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from conftest import TASKS  # noqa: E402
from cuda_agent.cli import app  # noqa: E402
from cuda_agent.rl.config import PPOConfig  # noqa: E402
from cuda_agent.rl.verl_recipe import UNCLIPPED, Recipe, prepare  # noqa: E402

transformers = pytest.importorskip("transformers")


def recipe(stage, model, out, **kw):
    return Recipe(stage, model, out, gpus_per_node=2, steps=3, batch=8, max_prompt=4096, max_response=4096, **kw)


@pytest.mark.parametrize("stage", ["warmup", "value", "agentic"])
def test_ppo_stages_compose_validate_and_name_our_agent_loop_and_reward(stage, tiny_smollm2, tmp_path):
    from hydra.utils import get_class

    script = prepare(recipe(stage, tiny_smollm2, tmp_path), tasks=[TASKS / "affine_relu.py", TASKS / "row_mean.py"])
    assert "verl.trainer.main_ppo" in script.read_text() and f"--config-name verl_{stage}" in script.read_text()
    config = OmegaConf.load(tmp_path / f"verl_{stage}.yaml")
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert (actor.optim.lr, config.critic.optim.lr) == (3e-6, 6e-6)
    assert config.algorithm.adv_estimator == "gae" and config.algorithm.gamma == 1
    assert config.algorithm.lam == PPOConfig.lam and config.data.filter_overlong_prompts  # as on the local path
    assert config.critic.cliprange_value == (UNCLIPPED if stage == "value" else PPOConfig.value_clip)
    assert config.critic.model.path == str(tiny_smollm2)
    assert config.trainer.critic_warmup == (3 if stage == "value" else 0) and config.trainer.total_training_steps == 3
    [loop] = OmegaConf.load(rollout.agent.agent_loop_config_path)
    assert get_class(loop["_target_"]).__name__ == "CudaAgentLoop" and loop.backend == "cuda"
    if stage == "warmup":
        assert rollout.agent.default_agent_loop == "single_turn_agent"
        assert config.reward.custom_reward_function.path == "pkg://cuda_agent.rl.verl_reward"
    else:
        assert rollout.agent.default_agent_loop == "cuda_agent"


def test_the_agentic_stage_takes_the_value_stages_critic(tiny_smollm2, tmp_path):
    critic = tmp_path / "value-critic"
    shutil.copytree(tiny_smollm2, critic)
    result = CliRunner().invoke(app, ["train", "verl", "--stage", "agentic", "--model", str(tiny_smollm2),
                                      "--critic", str(critic), "--data", str(TASKS / "affine_relu.py"), "--out",
                                      str(tmp_path / "run"), "--gpus-per-node", "2", "--batch", "8", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert OmegaConf.load(tmp_path / "run" / "verl_agentic.yaml").critic.model.path == str(critic.resolve())
    bad = CliRunner().invoke(app, ["train", "verl", "--stage", "agentic", "--model", str(tiny_smollm2), "--critic",
                                   str(tmp_path), "--data", str(TASKS / "affine_relu.py"), "--out",
                                   str(tmp_path / "run2"), "--dry-run"])
    assert bad.exit_code != 0 and "is not an HF model folder" in bad.output


def test_a_cluster_run_with_the_judge_on_ray_joins_the_cluster_and_says_where_to_judge(tiny_smollm2, tmp_path):
    import pyarrow.parquet as pq

    script = prepare(recipe("agentic", tiny_smollm2, tmp_path, nodes=2, judge="ray"), tasks=[TASKS / "affine_relu.py"])
    text = script.read_text()
    assert "export RAY_ADDRESS=${RAY_ADDRESS:-auto}" in text and "scripts/ray_cluster.sh" in text
    config = OmegaConf.load(tmp_path / "verl_agentic.yaml")
    assert config.trainer.nnodes == 2 and config.trainer.n_gpus_per_node == 2
    [loop] = OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    assert loop.judge == "ray"
    [row] = pq.read_table(tmp_path / "data" / "train.parquet").to_pylist()
    assert row["extra_info"]["judge"] == "ray"  # the warm-up's reward function reads it from the row
    single = prepare(recipe("agentic", tiny_smollm2, tmp_path / "one"), tasks=[TASKS / "affine_relu.py"])
    assert "RAY_ADDRESS" not in single.read_text()
    with pytest.raises(ValueError, match="judge must be"):
        recipe("agentic", tiny_smollm2, tmp_path, judge="remote")


def test_a_batch_verl_cannot_split_is_refused_with_verls_reason(tiny_smollm2, tmp_path):
    with pytest.raises(ValueError, match="verl rejects the agentic configuration"):
        prepare(Recipe("agentic", tiny_smollm2, tmp_path, gpus_per_node=4, batch=6), tasks=[TASKS / "affine_relu.py"])


def test_rft_writes_sft_data_verls_multi_turn_dataset_loads(tiny_smollm2, tmp_path):
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    run = tmp_path / "runs" / "good"
    run.mkdir(parents=True)
    call = {"id": "c", "type": "function", "function": {"name": "finish", "arguments": "{}"}}
    records = [{"type": "system", "message": {"role": "system", "content": "S"}},
               {"type": "user", "message": {"role": "user", "content": "Optimise it."}},
               {"type": "assistant", "turn": 1,
                "message": {"role": "assistant", "content": "Done.", "tool_calls": [call]}},
               {"type": "tool", "turn": 1, "message": {"role": "tool", "tool_call_id": "c", "content": "ok"}},
               {"type": "result", "summary": {"reference": "t.py", "final_verdict": {
                   "reward": 3, "policy_violations": [], "speedup_vs_compile": 1.2}}}]
    (run / "trajectory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    script = prepare(recipe("rft", tiny_smollm2, tmp_path / "out"), runs=[run])
    assert "verl.trainer.sft_trainer" in script.read_text()
    config = OmegaConf.load(tmp_path / "out" / "verl_rft.yaml")
    assert config.data.train_files.endswith("rft.parquet") and config.optim.lr == 3e-6
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_smollm2)
    data = MultiTurnSFTDataset(config.data.train_files, tokenizer, OmegaConf.create({"max_length": 4096}))
    item = data[0]
    text = tokenizer.decode(item["input_ids"][item["loss_mask"].bool()])
    assert "Done." in text and '"name": "finish"' in text and "Optimise it." not in text  # loss on the model only


def test_train_verl_dry_run_writes_the_run_and_says_how_to_launch_it(tiny_smollm2, tmp_path):
    result = CliRunner().invoke(app, ["train", "verl", "--stage", "agentic", "--model", str(tiny_smollm2), "--data",
                                      str(TASKS / "affine_relu.py"), "--out", str(tmp_path), "--gpus-per-node", "2",
                                      "--batch", "8", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "launch.sh" in result.output and (tmp_path / "verl_agentic.yaml").is_file()
    assert (tmp_path / "data" / "train.parquet").is_file()
    result = CliRunner().invoke(app, ["train", "verl", "--stage", "agentic", "--model", str(tiny_smollm2), "--data",
                                      str(TASKS / "affine_relu.py"), "--out", str(tmp_path), "--gpus-per-node", "2",
                                      "--batch", "8"])
    assert result.exit_code == 2 and "need vLLM or SGLang" in result.output.replace("\n", " "), result.output


def test_every_row_of_a_dataset_becomes_a_training_task_in_row_order(tiny_smollm2, tmp_path):
    import pyarrow.parquet as pq

    from cuda_agent.data.build import write_parquet

    source = (TASKS / "affine_relu.py").read_text()
    rows = [{"code": f"{source}\n# row {i}\n", "ops": "[]", "data_source": "torch#2", "num_ops": 2} for i in range(12)]
    write_parquet(rows, tmp_path / "ops.parquet")
    result = CliRunner().invoke(app, ["train", "verl", "--stage", "warmup", "--model", str(tiny_smollm2), "--data",
                                      str(tmp_path / "ops.parquet"), "--out", str(tmp_path / "run"),
                                      "--gpus-per-node", "2", "--batch", "8", "--dry-run"])
    assert result.exit_code == 0, result.output
    rows = pq.read_table(tmp_path / "run" / "data" / "train.parquet").to_pylist()
    names = [row["extra_info"]["task"] for row in rows]
    assert names == [f"ops_row{i}" for i in range(12)]  # all 12, row 10 after row 9
    (tmp_path / "bad.parquet").write_text("not parquet")
    result = CliRunner().invoke(app, ["train", "verl", "--stage", "warmup", "--model", str(tiny_smollm2), "--data",
                                      str(tmp_path / "bad.parquet"), "--out", str(tmp_path / "bad"), "--dry-run"])
    assert result.exit_code == 2 and "cannot read a `code` column" in result.output, result.output
