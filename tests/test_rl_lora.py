"""LoRA for the actor (rl/lora.py): only the updates train, a checkpoint's merged model and its small adapter give
the same policy, an adapter trained on another adapter's merge rebuilds from the root model after the run folder
moves, and a stage resumes its adapter."""

import shutil

import pytest
import torch

from cuda_agent.rl.config import PPOConfig, TrainConfig
from cuda_agent.rl.models import Actor, Critic
from cuda_agent.rl.trainer import PPOTrainer

IDS = torch.tensor([[5, 9, 3, 17, 22, 8, 40, 2]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def trained(model_dir, steps: int = 2, kl: float = 0.0) -> PPOTrainer:
    """A trainer whose actor has LoRA updates of rank 4, after `steps` supervised steps on IDS."""
    actor = Actor.load(model_dir)
    actor.add_lora(4, 8.0)
    trainer = PPOTrainer(actor, Critic.load(model_dir), TrainConfig(actor_lr=1e-2, ppo=PPOConfig(kl_coef=kl)),
                         lambda *a: None)
    trainer.base = model_dir
    for _ in range(steps):
        trainer.sft_update(IDS, torch.ones_like(IDS), torch.ones(1, IDS.shape[1] - 1))
    return trainer


def test_only_the_updates_train_and_the_merged_model_and_the_adapter_are_the_same_policy(tiny_llama, tmp_path):
    base = {k: v.clone() for k, v in Actor.load(tiny_llama).model.state_dict().items()}
    fresh = Actor.load(tiny_llama)
    fresh.add_lora(4, 8.0)
    assert torch.equal(logits(fresh.model), logits(Actor.load(tiny_llama).model))  # B starts at zero
    trainer = trained(tiny_llama, kl=0.1)
    actor = trainer.actor
    assert all(torch.equal(v, base[k]) for k, v in actor.model.state_dict().items())  # the base weights never move
    assert any(b.abs().sum() > 0 for b in actor.lora.B.values())  # (through gradient checkpointing)
    assert torch.allclose(logits(trainer.reference), logits(Actor.load(tiny_llama).model))  # KL to the start
    tuned = logits(actor.model)
    assert not torch.allclose(tuned, logits(Actor.load(tiny_llama).model), atol=1e-3)
    trainer.save(tmp_path / "ckpt", optimizer=False)
    adapter = tmp_path / "ckpt" / "actor" / "adapter"
    merged_bytes = sum(p.stat().st_size for p in (tmp_path / "ckpt" / "actor").glob("*.safetensors"))
    assert (adapter / "adapter_model.safetensors").stat().st_size < merged_bytes / 2
    assert torch.allclose(logits(Actor.load(tmp_path / "ckpt" / "actor").model), tuned, atol=1e-5)
    assert torch.allclose(logits(Actor.load(adapter).model), tuned, atol=1e-5)


def test_a_chain_of_adapters_rebuilds_from_the_root_model_after_the_run_folder_moves(tiny_llama, tmp_path):
    first = trained(tiny_llama)
    first.save(tmp_path / "run" / "sft" / "checkpoint-000002", optimizer=False)
    second = trained(tmp_path / "run" / "sft" / "checkpoint-000002" / "actor")
    second.save(tmp_path / "run" / "ppo" / "checkpoint-000002", optimizer=False)
    want = logits(second.actor.model)
    moved = tmp_path / "home" / "run"
    shutil.copytree(tmp_path / "run", moved)
    for heavy in moved.rglob("model.safetensors"):  # only adapters come back from the device
        heavy.unlink()
    shutil.rmtree(tmp_path / "run")
    from cuda_agent.rl.lora import merged_model

    adapter = moved / "ppo" / "checkpoint-000002" / "actor" / "adapter"
    with pytest.raises(FileNotFoundError, match="base model"):
        merged_model(adapter, root=tmp_path / "nowhere")
    assert torch.allclose(logits(merged_model(adapter, root=tiny_llama)), want, atol=1e-5)


def test_a_stage_with_lora_trains_saves_its_adapter_and_resumes_it(tiny_checkpoint, tmp_path):
    """`train --stage rft --lora-rank 4`: the checkpoint holds the merged actor and the adapter (on the start model);
    a longer rerun resumes the adapter from the start model, and `Actor.load` of the adapter is the saved policy."""
    import json

    from typer.testing import CliRunner

    from cuda_agent.cli import app
    from test_rl_stages import write_run

    write_run(tmp_path / "runs" / "good", 3)
    out = tmp_path / "rft"

    def train(steps: int) -> str:
        result = CliRunner().invoke(app, ["train", "--stage", "rft", "--model", str(tiny_checkpoint), "--runs",
                                          str(tmp_path / "runs"), "--out", str(out), "--steps", str(steps), "--batch",
                                          "1", "--device", "cpu", "--lora-rank", "4", "--actor-lr", "1e-2",
                                          "--save-optimizer"])
        assert result.exit_code == 0, result.output
        return result.output

    train(2)
    adapter = out / "checkpoint" / "actor" / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["base_model_name_or_path"] == str(tiny_checkpoint.resolve())
    saved = logits(Actor.load(adapter).model)
    resumed = Actor.load(tiny_checkpoint)
    resumed.add_lora(4, 16.0, adapter)
    assert torch.allclose(logits(resumed.model), saved, atol=1e-5)
    assert not torch.allclose(saved, logits(Actor.load(tiny_checkpoint).model), atol=1e-4)  # it learned something
    assert "afresh" not in train(3)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[2]["sft_loss"] < rows[0]["sft_loss"]


def test_train_eval_plays_an_adapter_rebuilt_on_a_root_model_given_after_the_run_moved(tiny_checkpoint, tmp_path,
                                                                                      cache_dir, fast_cli):
    """An rft stage with LoRA from a model folder that is then gone: `train eval --model ADAPTER` says the base is
    not here; with `--root-model` (the same weights elsewhere) it plays the adapter's policy."""
    from typer.testing import CliRunner

    from cuda_agent.cli import app
    from conftest import TASKS
    from test_rl_stages import write_run

    write_run(tmp_path / "runs" / "good", 3)
    origin = tmp_path / "origin"
    shutil.copytree(tiny_checkpoint, origin)
    result = CliRunner().invoke(app, ["train", "--stage", "rft", "--model", str(origin), "--runs",
                                      str(tmp_path / "runs"), "--out", str(tmp_path / "rft"), "--steps", "1",
                                      "--batch", "1", "--device", "cpu", "--lora-rank", "4"])
    assert result.exit_code == 0, result.output
    shutil.rmtree(origin)
    adapter = tmp_path / "rft" / "checkpoint" / "actor" / "adapter"
    args = ["train", "eval", "--model", str(adapter), "--data", str(TASKS / "row_mean.py"), "--out",
            str(tmp_path / "eval"), "--backend", "cpu", "--samples", "1", "--max-turns", "1", "--max-new-tokens",
            "4", "--cache-dir", str(cache_dir)]
    missing = CliRunner().invoke(app, args)
    assert missing.exit_code == 2 and "base model" in missing.output and "is not here" in missing.output
    played = CliRunner().invoke(app, [*args, "--root-model", str(tiny_checkpoint)])
    assert played.exit_code == 0, played.output
    assert "1 tasks, 1 episodes" in (tmp_path / "eval" / "eval.md").read_text()


def test_two_runs_of_one_seed_train_the_same_adapter(tiny_checkpoint, tmp_path):
    """The adapter's initial updates and the minibatch order follow the stage's seed, not whatever drew from
    torch's generator before (here: the first run, in the same process)."""
    from typer.testing import CliRunner

    from cuda_agent.cli import app
    from test_rl_stages import write_run

    write_run(tmp_path / "runs" / "good", 3)
    for name in ("first", "second"):
        result = CliRunner().invoke(app, ["train", "--stage", "rft", "--model", str(tiny_checkpoint), "--runs",
                                          str(tmp_path / "runs"), "--out", str(tmp_path / name), "--steps", "1",
                                          "--batch", "1", "--device", "cpu", "--lora-rank", "4", "--seed", "7"])
        assert result.exit_code == 0, result.output
    weights = [(tmp_path / name / "checkpoint" / "actor" / "adapter" / "adapter_model.safetensors").read_bytes()
               for name in ("first", "second")]
    assert weights[0] == weights[1]
