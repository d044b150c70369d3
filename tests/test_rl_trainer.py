"""Constrained replies and the PPO trainer on a tiny model with SmolLM2's tokenizer (no judge: a fixed reward per
option, so the assertions are about the mechanics): sampling and training agree on log-probs, probability moves to
the rewarded option, a checkpoint resumes exactly, metrics are cut back to the checkpoint on resume."""

import json
import math

import pytest
import torch

from cuda_agent.rl.choice import ChoiceReply, Slot
from cuda_agent.rl.demo import _batch, build_models, slots
from cuda_agent.rl.models import Actor, Critic
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


def test_a_checkpoint_resumes_the_same_training(setup, tmp_path):
    tokenizer, reply, prompt, actor, critic = setup
    config = TrainConfig(actor_lr=1e-3, critic_lr=1e-3)
    trainer = PPOTrainer(actor, critic, config, reply.logprob_fn(len(prompt)))
    step(trainer, reply, prompt, torch.Generator().manual_seed(1))
    trainer.save(tmp_path / "ckpt", tokenizer)
    torch.manual_seed(7)
    continued, _ = step(trainer, reply, prompt, torch.Generator().manual_seed(2))

    resumed = PPOTrainer(Actor.load(tmp_path / "ckpt" / "actor"), Critic.load(tmp_path / "ckpt" / "critic"), config,
                         reply.logprob_fn(len(prompt)))
    resumed.restore(tmp_path / "ckpt")
    assert resumed.step == 1
    torch.manual_seed(7)
    again, _ = step(resumed, reply, prompt, torch.Generator().manual_seed(2))
    for key in ("policy_loss", "value_loss", "approx_kl"):
        assert again[key] == pytest.approx(continued[key], rel=1e-4, abs=1e-6), key
    assert not (tmp_path / "ckpt.tmp").exists() and not (tmp_path / "ckpt.old").exists()


def test_metrics_are_cut_back_to_the_checkpoint_on_resume(tmp_path):
    log = MetricsLog(tmp_path, tensorboard=False)
    for s in (1, 2, 3):
        log.write(s, {"reward_mean": float(s), "explained_variance": float("nan")})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[0]["explained_variance"] is None
    MetricsLog(tmp_path, resume_step=2, tensorboard=False)
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
