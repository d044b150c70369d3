"""Constrained replies and the PPO trainer on a tiny model with SmolLM2's tokenizer (no judge: a fixed reward per
option, so the assertions are about the mechanics): sampling and training agree on log-probs, probability moves to
the rewarded option, a checkpoint resumes exactly (or, saved without the optimizers' state, with fresh optimizers),
a run folder keeps its newest checkpoints only, metrics are cut back to the checkpoint on resume."""

import json
import math
from dataclasses import replace

import pytest
import torch

from cuda_agent.rl import checkpoints
from cuda_agent.rl.choice import ChoiceReply, Slot
from cuda_agent.rl.demo import _batch, build_models, slots
from cuda_agent.rl.models import Actor, Critic
from cuda_agent.rl.recipe import RecipeConfig
from cuda_agent.rl.tokens import TurnTokenizer
from cuda_agent.rl.trainer import MetricsLog, PPOTrainer, TrainConfig

transformers = pytest.importorskip("transformers")

REWARD = [3, 2, -1, 1]  # per kernel option, as the judge scored them on the CPU


@pytest.fixture
def setup(tiny_smollm2):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_smollm2)
    reply = ChoiceReply(TurnTokenizer(tokenizer), slots("cuda"))
    prompt = reply.turns.start([{"role": "user", "content": "Pick.\n" + reply.instructions()}]).ids
    torch.manual_seed(0)
    actor, critic = build_models(tiny_smollm2, True, "cpu", torch.float32)
    return tokenizer, reply, prompt, actor, critic


def step(trainer, reply, prompt, generator, batch=16):
    choices, logp = reply.sample(trainer.actor.model, prompt, batch, generator)
    scores = [REWARD[c[0]] for c in choices]
    return trainer.update(_batch(reply, prompt, choices, logp, scores)), scores


def test_a_reply_is_one_allowed_token_per_slot_and_training_recomputes_its_log_probs(setup):
    tokenizer, reply, prompt, actor, _ = setup
    assert "1. the kernel:" in reply.instructions() and "   3: 256" in reply.instructions()
    choices, logp = reply.sample(actor.model, prompt, 8, torch.Generator().manual_seed(3))
    assert logp.shape == (8, 2) and bool((logp <= 0).all())
    for i, choice in enumerate(choices):
        t = reply.trajectory(prompt, choice, logp[i].tolist())
        assert t.mask == [1, 1, 0] and t.response[-1] == reply.turns.end_of_turn
        assert tokenizer.decode(t.response[:2]) == "".join(reply.texts(choice))
    batch = _batch(reply, prompt, choices, logp, [0] * 8)
    again, entropy = reply.logprob_fn(len(prompt))(actor.model, batch.ids, batch.attention)
    assert torch.allclose(again[:, :2], logp, atol=1e-5) and bool((again[:, 2] == 0).all())
    assert bool((entropy[:, :2] > 0).all()) and bool((entropy[:, :2] <= math.log(4) + 1e-5).all())


def test_an_option_that_is_not_one_token_is_refused(setup):
    tokenizer = setup[0]
    with pytest.raises(ValueError, match="not one token"):
        ChoiceReply(TurnTokenizer(tokenizer), [Slot("kernel", {"vectorised": "x", "B": "y"})])


def test_ppo_moves_probability_to_the_rewarded_option(setup):
    _, reply, prompt, actor, critic = setup
    trainer = PPOTrainer(actor, critic, TrainConfig(actor_lr=1e-3, critic_lr=1e-3), reply.logprob_fn(len(prompt)))
    before = reply.distribution(actor.model, prompt)
    generator = torch.Generator().manual_seed(1)
    means = []
    for _ in range(4):
        stats, scores = step(trainer, reply, prompt, generator)
        means.append(sum(scores) / len(scores))
        assert all(math.isfinite(stats[k]) for k in ("policy_loss", "value_loss", "entropy", "approx_kl"))
        assert stats["rollout_logp_gap"] < 1e-4 and stats["tokens"] == 32
    after = reply.distribution(actor.model, prompt)
    assert after[0] > before[0] + 0.1 and after[2] < before[2], (before, after)
    assert trainer.step == 4


def test_with_groups_the_actor_learns_from_contrasts_within_a_group_only(setup):
    """Two tasks of two episodes each, each task's pair scoring alike (1, 1 and -1, -1): the critic's baseline still
    pushes the actor (the batch's returns differ), a group baseline gives it nothing to learn; the critic learns the
    same either way."""
    _, reply, prompt, actor, critic = setup
    choices, logp = reply.sample(actor.model, prompt, 4, torch.Generator().manual_seed(5))
    batch = _batch(reply, prompt, choices, logp, [1, 1, -1, -1])
    trainer = PPOTrainer(actor, critic, TrainConfig(actor_lr=0.0, critic_lr=0.0, value_head_lr=0.0, epochs=1,
                                                    minibatches=1), reply.logprob_fn(len(prompt)))
    plain = trainer.update(batch)
    batch.groups = torch.tensor([0, 0, 1, 1])
    grouped = trainer.update(batch)
    assert plain["actor_grad_norm"] > 0 and grouped["actor_grad_norm"] == 0 and grouped["policy_loss"] == 0
    assert grouped["value_loss"] == pytest.approx(plain["value_loss"])
    batch.groups = torch.tensor([0, 1, 0, 1])  # each group holds a 1 and a -1: a contrast to learn from
    assert trainer.update(batch)["actor_grad_norm"] > 0


def test_value_pretraining_at_the_recipe_s_settings_learns_returns_the_ninth_attempt_s_did_not(setup, tiny_smollm2):
    """The critic alone learns (value pretraining) on fresh batches: at the recipe's settings (head lr 1e-3, 8
    passes a batch) it foresees the next batch's returns after three; at the ninth attempt's (1e-4, 2 passes) its
    zero-initialised head barely moved, as on the GPU (explained variance 0 after three steps)."""
    _, reply, prompt, _, _ = setup
    recipe = RecipeConfig().stage_config("value", 4).train
    foresight = {}
    for name, config in (("recipe", recipe), ("ninth", replace(recipe, value_head_lr=1e-4, epochs=2))):
        torch.manual_seed(0)
        actor, critic = build_models(tiny_smollm2, True, "cpu", torch.float32)
        trainer = PPOTrainer(actor, critic, config, reply.logprob_fn(len(prompt)))
        generator = torch.Generator().manual_seed(1)
        for _ in range(4):  # (each step's explained variance: on its batch, before learning from it)
            choices, logp = reply.sample(actor.model, prompt, 16, generator)
            stats = trainer.update(_batch(reply, prompt, choices, logp, [REWARD[c[0]] for c in choices]),
                                   train_actor=False)
        foresight[name] = stats["explained_variance"]
        assert stats["approx_kl"] == 0 and stats["clip_fraction"] == 0  # (the actor did not move)
    assert recipe.epochs == 8 and recipe.value_head_lr == 1e-3
    assert foresight["recipe"] > 0.1 and foresight["ninth"] < 0.02, foresight


def test_a_checkpoint_resumes_the_same_training(setup, tmp_path):
    tokenizer, reply, prompt, actor, critic = setup
    config = TrainConfig(actor_lr=1e-3, critic_lr=1e-3)
    trainer = PPOTrainer(actor, critic, config, reply.logprob_fn(len(prompt)))
    step(trainer, reply, prompt, torch.Generator().manual_seed(1))
    trainer.save(tmp_path / "ckpt", tokenizer, optimizer=True)
    torch.manual_seed(7)
    continued, _ = step(trainer, reply, prompt, torch.Generator().manual_seed(2))

    resumed = PPOTrainer(Actor.load(tmp_path / "ckpt" / "actor"), Critic.load(tmp_path / "ckpt" / "critic"), config,
                         reply.logprob_fn(len(prompt)))
    logged = []
    resumed.restore(tmp_path / "ckpt", logged.append)
    assert resumed.step == 1 and logged == []
    torch.manual_seed(7)
    again, _ = step(resumed, reply, prompt, torch.Generator().manual_seed(2))
    for key in ("policy_loss", "value_loss", "approx_kl"):
        assert again[key] == pytest.approx(continued[key], rel=1e-4, abs=1e-6), key
    assert not (tmp_path / "ckpt.tmp").exists() and not (tmp_path / "ckpt.old").exists()


def test_a_checkpoint_restores_the_cpu_generator_state_of_a_stage_trained_on_another_device(setup, tmp_path,
                                                                                           monkeypatch):
    """A stage keeps its own torch.Generator's state in the checkpoint's extra; a trainer whose actor is on the
    GPU must hand it back as a CPU ByteTensor (read onto the actor's device, a resumed SFT on the H200 failed with
    "RNG state must be a torch.ByteTensor"). The actor's device is faked here: "meta" stands for "not the CPU"."""
    tokenizer, reply, prompt, actor, critic = setup
    trainer = PPOTrainer(actor, critic, TrainConfig(), reply.logprob_fn(len(prompt)))
    generator = torch.Generator().manual_seed(3)
    trainer.save(tmp_path / "ckpt", tokenizer, {"generator": generator.get_state()}, optimizer=True)
    expected = torch.rand(4, generator=generator)
    monkeypatch.setattr(Actor, "device", property(lambda self: torch.device("meta")))
    extra = trainer.restore(tmp_path / "ckpt")
    again = torch.Generator()
    again.set_state(extra["generator"])
    assert torch.equal(torch.rand(4, generator=again), expected)


def test_a_checkpoint_without_the_optimizer_state_resumes_with_fresh_optimizers(setup, tmp_path):
    tokenizer, reply, prompt, actor, critic = setup
    config = TrainConfig(actor_lr=1e-3, critic_lr=1e-3)
    trainer = PPOTrainer(actor, critic, config, reply.logprob_fn(len(prompt)))
    step(trainer, reply, prompt, torch.Generator().manual_seed(1))
    trainer.save(tmp_path / "with", tokenizer, optimizer=True)
    trainer.save(tmp_path / "without", tokenizer, optimizer=False)
    state = torch.load(tmp_path / "without" / "trainer.pt", weights_only=False)
    assert state["step"] == 1 and "actor_optim" not in state and "critic_optim" not in state
    weights = (tmp_path / "with" / "actor" / "model.safetensors").stat().st_size
    assert (tmp_path / "with" / "trainer.pt").stat().st_size > weights  # the two Adam moments of actor and critic
    assert (tmp_path / "without" / "trainer.pt").stat().st_size < weights / 10

    resumed = PPOTrainer(Actor.load(tmp_path / "without" / "actor"), Critic.load(tmp_path / "without" / "critic"),
                         config, reply.logprob_fn(len(prompt)))
    logged = []
    resumed.restore(tmp_path / "without", logged.append)
    assert resumed.step == 1 and resumed.actor_optim.state_dict()["state"] == {}
    assert len(logged) == 1 and "no optimizer state" in logged[0] and "afresh" in logged[0]
    stats, _ = step(resumed, reply, prompt, torch.Generator().manual_seed(2))
    assert resumed.step == 2 and math.isfinite(stats["policy_loss"])


def test_a_run_folder_keeps_its_newest_checkpoints_and_links_the_newest(setup, tmp_path):
    tokenizer, reply, prompt, actor, critic = setup
    trainer = PPOTrainer(actor, critic, TrainConfig(), reply.logprob_fn(len(prompt)))
    old = tmp_path / "checkpoint"  # an earlier version's checkpoint folder, resumed from, then replaced by the link
    trainer.save(old, tokenizer, optimizer=False)
    assert checkpoints.latest(tmp_path) == old
    (tmp_path / "checkpoint-000009.tmp").mkdir()  # a save a crash interrupted
    logged = []
    for trainer.step in (1, 2, 3, 4):
        folder = checkpoints.save(trainer, tmp_path, tokenizer, {}, keep=2, optimizer=False, log=logged.append)
        assert (tmp_path / "checkpoint").resolve() == folder.resolve()
        assert (tmp_path / "checkpoint" / "actor" / "config.json").is_file()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["checkpoint", "checkpoint-000003", "checkpoint-000004"], names
    assert (tmp_path / "checkpoint").is_symlink() and checkpoints.latest(tmp_path) == tmp_path / "checkpoint-000004"
    assert len(logged) == 4 and logged[-1].startswith("checkpoint step 4: ") and " MB in " in logged[-1]
    assert logged[-1].endswith("(optimizer state not kept)"), logged[-1]
    size = sum(p.stat().st_size for p in (tmp_path / "checkpoint-000004").rglob("*") if p.is_file())
    assert f"{size / 1e6:.1f} MB" in logged[-1]


def test_metrics_are_cut_back_to_the_checkpoint_on_resume(tmp_path):
    log = MetricsLog(tmp_path, tensorboard=False)
    for s in (1, 2, 3):
        log.write(s, {"reward_mean": float(s), "explained_variance": float("nan")})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[0]["explained_variance"] is None
    MetricsLog(tmp_path, resume_step=2, tensorboard=False)
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_each_training_step_says_how_far_it_is_and_how_long_is_left(tmp_path):
    """A line per step with the count and the time left (training is the longest command there is)."""
    from cuda_agent.rl.config import RunConfig
    from cuda_agent.rl.train_loop import run_steps

    class Trainer:
        step = 0

        def save(self, folder, tokenizer, extra, *, optimizer):
            folder.mkdir(parents=True)
            return folder

    trainer, said = Trainer(), []

    def step():
        trainer.step += 1
        return {"reward_mean": 1.0}

    run_steps(trainer, step, tmp_path, RunConfig(steps=3, save_every=10), tokenizer=None, log=said.append)
    lines = [line for line in said if line.startswith("step ")]
    assert [line.split("[")[1].split(",")[0] for line in lines] == ["1/3", "2/3", "3/3"]
    assert "min left]" in lines[0] and "min left" not in lines[-1]


@pytest.mark.parametrize("updating", [False, True])
def test_an_interrupted_run_keeps_the_steps_it_ended_unless_the_weights_were_changing(tmp_path, updating):
    """Ctrl-C or SIGTERM in step 3 of a run that checkpoints every 10: steps 1-2 are saved (with the RNG as step 2
    left it), unless step 3 was changing the weights, whose half-updated state must never be saved."""
    from cuda_agent.rl.config import RunConfig
    from cuda_agent.rl.train_loop import run_steps

    class Trainer:
        step, updating = 0, False

        def save(self, folder, tokenizer, extra, *, optimizer):
            folder.mkdir(parents=True)
            torch.save({"step": self.step, "torch_rng": torch.get_rng_state(), "extra": extra}, folder / "trainer.pt")
            return folder

    trainer, said = Trainer(), []

    def step():
        torch.rand(3)  # the step draws from the RNG
        if trainer.step == 2:
            trainer.updating = updating
            raise KeyboardInterrupt
        trainer.step += 1
        return {}

    torch.manual_seed(0)
    with pytest.raises(KeyboardInterrupt):
        run_steps(trainer, step, tmp_path, RunConfig(steps=5, save_every=10), tokenizer=None, log=said.append,
                  state=lambda: {"rng_step": trainer.step})
    if updating:
        assert checkpoints.latest(tmp_path) is None and any("nothing saved" in line for line in said)
        return
    saved = torch.load(checkpoints.latest(tmp_path) / "trainer.pt", weights_only=False)
    assert saved["step"] == 2 and saved["extra"] == {"rng_step": 2}
    torch.manual_seed(0)  # the RNG as step 2 left it: what an uninterrupted run's step 3 starts from
    for _ in range(2):
        torch.rand(3)
    assert torch.equal(saved["torch_rng"], torch.get_rng_state())
