"""The RL algorithm against values computed by hand."""

import math

import pytest
import torch

from cuda_agent.rl.algorithm import (PPOConfig, entropy, explained_variance, gae, group_advantages, kl_penalty,
                                     masked_whiten, outcome_rewards, policy_loss, ppo_losses, token_logprobs,
                                     value_loss)


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_gae_over_model_tokens_only():
    adv, ret = gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=1.0, lam=0.95)
    # t=2: 1 - 0.7 = 0.3; t=1: (0.7 - 0.6) + 0.95 * 0.3 = 0.385; t=0: (0.6 - 0.5) + 0.95 * 0.385 = 0.46575
    assert torch.allclose(adv, t([0.46575, 0.385, 0.3])) and torch.allclose(ret, t([0.96575, 0.985, 1.0]))
    # A tool observation between model turns is no step: same numbers, its values never used.
    gap_adv, gap_ret = gae(t([0, 0, 0, 0, 1]), t([0.5, 0.6, 9, 9, 0.7]), t([1, 1, 0, 0, 1]), gamma=1.0, lam=0.95)
    assert torch.allclose(gap_adv, t([0.46575, 0.385, 0, 0, 0.3]))
    assert torch.allclose(gap_ret, t([0.96575, 0.985, 0, 0, 1.0]))
    # gamma discounts, lambda 1 is the Monte Carlo return; rows are independent.
    adv, ret = gae(t([0, 1], [0, 0]), t([0, 0], [0.2, 0.1]), t([1, 1], [1, 1]), gamma=0.9, lam=1.0)
    assert torch.allclose(adv, t([0.9, 1.0], [-0.2, -0.1])) and torch.allclose(ret, t([0.9, 1.0], [0, 0]))


def test_the_outcome_reward_sits_on_the_last_model_token():
    rewards = outcome_rewards(t(3, -1), t([1, 1, 0, 1, 0], [0, 0, 0, 0, 0]))
    assert torch.equal(rewards, t([0, 0, 0, 3, 0], [0, 0, 0, 0, 0]))


def test_the_policy_loss_clips_asymmetrically_and_averages_over_tokens():
    old = torch.zeros(1, 4, dtype=torch.float64)
    logp = t([math.log(1.5), math.log(0.5), 0.0, 5.0])
    adv = t([1.0, -1.0, 2.0, 100.0])
    loss, stats = policy_loss(logp, old, adv, t([1, 1, 1, 0]), clip_low=0.2, clip_high=0.28)
    # ratio 1.5 with A=1: clipped to 1.28 -> -1.28; ratio 0.5 with A=-1: clipped to 0.8 -> 0.8; ratio 1, A=2: -2.
    assert float(loss) == pytest.approx((-1.28 + 0.8 - 2.0) / 3)
    assert stats["clip_fraction"] == pytest.approx(2 / 3)
    assert stats["approx_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.5)) / 3)
    # Inside the clip range the gradient is -A * ratio per token, averaged.
    logp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    policy_loss(logp, torch.zeros(1, 2, dtype=torch.float64), t([1.0, -3.0]), t([1, 1]))[0].backward()
    assert torch.allclose(logp.grad, t([-0.5, 1.5]))


def test_the_value_loss_takes_the_worse_of_clipped_and_unclipped():
    loss, stats = value_loss(t([1.0]), t([0.5]), t([2.0]), t([1]), clip=0.2)
    assert float(loss) == pytest.approx(0.5 * (0.7 - 2.0) ** 2) and stats["value_clip_fraction"] == 1.0
    loss, _ = value_loss(t([0.6]), t([0.5]), t([2.0]), t([1]), clip=0.2)
    assert float(loss) == pytest.approx(0.5 * 1.4 ** 2)


def test_kl_entropy_whitening_and_explained_variance():
    assert float(kl_penalty(t([math.log(0.5)]), t([math.log(0.5)]))) == 0.0
    assert float(kl_penalty(t([math.log(0.5)]), t([math.log(0.25)]))) == pytest.approx(0.5 + math.log(0.5) * -1 - 1)
    assert float(entropy(torch.zeros(1, 1, 4))) == pytest.approx(math.log(4))
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    assert float(token_logprobs(logits, torch.tensor([[1]]))) == pytest.approx(math.log(0.75))
    white = masked_whiten(t([1, 2, 3, 100]), t([1, 1, 1, 0]))
    assert torch.allclose(white, t([-1.224744871, 0, 1.224744871, 0]), atol=1e-6)
    assert explained_variance(t([1, 2, 3]), t([1, 2, 3]), t([1, 1, 1])) == pytest.approx(1.0)
    assert explained_variance(t([2, 2, 2]), t([1, 2, 3]), t([1, 1, 1])) == pytest.approx(0.0)
    flat = t([-1.0, -1.0, -1.0]) + t([0.0, 1e-6, -1e-6])  # every episode -1, returns differing by rounding only
    assert math.isnan(explained_variance(t([0.3, -0.2, 0.1]), flat, t([1, 1, 1])))


def test_ppo_losses_combine_the_terms_as_configured():
    mask = t([1, 1, 0])
    logp, old, adv = t([0.1, -0.1, 9]), t([0.0, 0.0, 0]), t([1.0, -1.0, 5])
    values, returns = t([0.5, 0.5, 0]), t([1.0, 0.0, 0])
    plain = ppo_losses(PPOConfig(whiten_advantages=False), logp, old, adv, values, values, returns, mask)
    assert float(plain[0]) == pytest.approx(float(policy_loss(logp, old, adv, mask)[0]))
    assert float(plain[1]) == pytest.approx(0.5 * 0.25)
    ref, ent = t([0.0, 0.0, 0]), t([1.0, 3.0, 50])
    full = ppo_losses(PPOConfig(whiten_advantages=False, kl_coef=0.5, entropy_coef=0.1), logp, old, adv, values,
                      values, returns, mask, ref_logp=ref, token_entropy=ent)
    kl = (float(kl_penalty(t([0.1]), t([0.0]))) + float(kl_penalty(t([-0.1]), t([0.0])))) / 2
    assert float(full[0]) == pytest.approx(float(plain[0]) + 0.5 * kl - 0.1 * 2.0)
    assert full[2]["kl"] == pytest.approx(kl) and full[2]["entropy"] == pytest.approx(2.0)


def test_truncated_importance_sampling_weights_each_token_by_the_capped_trainer_over_sampler_ratio():
    """Off by default; on, a token the sampler drew at half the trainer's probability counts twice, one it drew at
    a hundredth counts `tis_cap` times, and the weights carry no gradient."""
    mask = t([1, 1, 1])
    logp = t([0.0, 0.0, 0.0]).requires_grad_()
    old, adv, values = t([0.0, 0.0, 0.0]), t([1.0, 1.0, 1.0]), t([0.0, 0.0, 0.0])
    sampler = torch.log(t([1.0, 0.5, 0.01]))
    off = ppo_losses(PPOConfig(whiten_advantages=False), logp, old, adv, values, values, values, mask,
                     sampler_logp=sampler)
    assert float(off[0]) == pytest.approx(-1.0) and "tis_weight_mean" not in off[2]
    on = ppo_losses(PPOConfig(whiten_advantages=False, tis_cap=2.0), logp, old, adv, values, values, values, mask,
                    sampler_logp=sampler)
    assert float(on[0]) == pytest.approx(-(1.0 + 2.0 + 2.0) / 3)
    assert on[2]["tis_weight_mean"] == pytest.approx(5 / 3)
    on[0].backward()
    assert torch.allclose(logp.grad, -t([1.0, 2.0, 2.0]) / 3)
    with pytest.raises(ValueError, match="tis_cap"):
        PPOConfig(tis_cap=0.5)


def test_the_default_lambdas_carry_the_outcome_to_the_first_token_of_a_kernel_writing_turn():
    """A `write_file` turn that holds a kernel is ~1,300 model tokens; with the paper's lambda 0.95 and a critic
    that knows nothing, its first token gets 0.95^1300 of the outcome: nothing. The defaults (1 for the actor and
    the critic) give every token the whole outcome less its value."""
    from cuda_agent.rl.algorithm import advantages_and_returns

    mask = torch.ones(1, 1300)
    rewards = outcome_rewards(torch.tensor([3.0]), mask)
    values = torch.zeros(1, 1300)
    advantages, returns = advantages_and_returns(rewards, values, mask, PPOConfig())
    assert float(advantages[0, 0]) == pytest.approx(3.0) and torch.allclose(returns, torch.full((1, 1300), 3.0))
    paper, _ = advantages_and_returns(rewards, values, mask, PPOConfig(lam=0.95, critic_lam=0.95))
    assert float(paper[0, 0]) < 1e-20
    apart = advantages_and_returns(rewards, values, mask, PPOConfig(lam=0.95, critic_lam=1.0))
    assert float(apart[0][0, 0]) < 1e-20 and float(apart[1][0, 0]) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="lam must be in"):
        PPOConfig(lam=1.5)


def test_the_value_loss_without_a_clip_is_the_plain_squared_error():
    loss, stats = value_loss(t([1.0]), t([0.5]), t([2.0]), t([1]), clip=None)
    assert float(loss) == pytest.approx(0.5) and stats["value_clip_fraction"] == 0.0


def test_a_group_baseline_is_each_episode_s_score_less_its_task_group_s_mean():
    """StageConfig.group: episodes 0-1 share a task (scores 3, -1: mean 1), episodes 2-3 another (2, 2: no contrast,
    no advantage); on model tokens only."""
    mask = t([1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1])
    adv = group_advantages(t(3, -1, 2, 2), torch.tensor([0, 0, 1, 1]), mask)
    assert torch.equal(adv, t([2, 2, 0], [-2, 0, 0], [0, 0, 0], [0, 0, 0]))


def test_a_group_must_divide_the_batch_and_compare_outcomes():
    from cuda_agent.rl.config import StageConfig, TrainConfig

    assert StageConfig(batch=16, group=4).group == 4
    with pytest.raises(ValueError, match="dividing the batch"):
        StageConfig(batch=16, group=3)
    with pytest.raises(ValueError, match="gamma 1"):
        StageConfig(batch=4, group=2, train=TrainConfig(ppo=PPOConfig(gamma=0.9)))
