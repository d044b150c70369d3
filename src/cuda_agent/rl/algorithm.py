"""PPO with a critic over the model's own tokens: the losses and advantages of the paper's training stages.

Every tensor is `[batch, tokens]` over an episode's response (everything after the first prompt), with `mask` 1 on
tokens the model sampled and 0 on tool observations and chat-template tokens between its turns. Those tokens are
not steps: GAE skips them, so the model token before a tool result bootstraps from the model's next token, and
the outcome reward sits on the last model token. Losses are token means over every model token of the batch
(verl's `token-mean`). Ratio clip 0.2 low / 0.28 high and gamma 1 are the paper's; lambda is the actor's and the
critic's apart (config.py says why both are 1 here).

A batch whose episodes all scored the same (all -1: the common case for a small model) teaches the actor nothing:
whitening would turn the critic's errors (a zero critic's ramp of lambda^k) into unit-scale advantages, measured
at -4.7 std on a reply's last tokens, a push never to end one. Such a batch trains the critic only
(`PPOConfig.skip_uniform`); chosen over a whitening floor, which still pushes by the critic's error, and over
per-task groups, which need several episodes of each task in a batch.
"""

from __future__ import annotations

import torch

from .config import PPOConfig



def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries (population variance); masked-out entries become 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def outcome_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token rewards: each episode's score on its last model token, 0 elsewhere."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask.bool(), positions, -1).max(dim=1).values
    rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=mask.device)
    has_tokens = last >= 0
    rewards[has_tokens, last[has_tokens]] = scores[has_tokens]
    return rewards


@torch.no_grad()
def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns, stepping only over model tokens (masked-out tokens carry the next step through).
    The value after an episode's last model token is 0."""
    mask = mask.to(values.dtype)
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        step = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = advantage * step
        next_value = torch.where(step.bool(), values[:, t], next_value)
        next_advantage = torch.where(step.bool(), advantage, next_advantage)
    returns = (advantages + values) * mask
    return advantages, returns


def advantages_and_returns(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, config: PPOConfig
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The actor's advantages (GAE with `lam`) and the critic's targets (with `critic_lam`)."""
    advantages, returns = gae(rewards, values, mask, config.gamma, config.lam)
    if config.critic_lam != config.lam:
        returns = gae(rewards, values, mask, config.gamma, config.critic_lam)[1]
    return advantages, returns


def group_advantages(scores: torch.Tensor, groups: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each episode's score less the mean of its group's (the episodes of one task in a step), on each of its model
    tokens: the baseline a critic that explains none of the returns cannot give (with gamma 1 and an outcome reward,
    a token's return is its episode's score)."""
    sums = torch.zeros(int(groups.max()) + 1, dtype=scores.dtype, device=scores.device).index_add_(0, groups, scores)
    means = sums / torch.bincount(groups).to(scores.dtype)
    return (scores - means[groups]).unsqueeze(1) * mask


def uniform(scores: torch.Tensor) -> bool:
    """Whether every episode of a batch scored the same."""
    return bool((scores == scores[0]).all())


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_low: float = 0.2, clip_high: float = 0.28, weights: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate with an asymmetric clip range, each token's term times `weights` when given
    (truncated importance sampling); also the share of tokens clipped and the k1 KL between the rollout policy
    and this one."""
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    terms = torch.maximum(unclipped, clipped)
    loss = masked_mean(terms * weights if weights is not None else terms, mask)
    with torch.no_grad():
        stats = {"clip_fraction": float(masked_mean((clipped > unclipped).to(logp.dtype), mask)),
                 "approx_kl": float(masked_mean(old_logp - logp, mask))}
    return loss, stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None = 0.5) -> tuple[torch.Tensor, dict[str, float]]:
    """Half the squared error to the returns, the worse of the unclipped and the clipped value (PPO's critic;
    `clip` None: unclipped)."""
    clipped = values if clip is None else old_values + (values - old_values).clamp(-clip, clip)
    loss = 0.5 * masked_mean(torch.maximum((values - returns) ** 2, (clipped - returns) ** 2), mask)
    with torch.no_grad():
        stats = {"value_clip_fraction": float(masked_mean(((clipped - returns) ** 2 > (values - returns) ** 2)
                                                          .to(values.dtype), mask))}
    return loss, stats


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(policy || reference), the k3 estimator: non-negative, unbiased, low variance."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy of the distribution the logits define."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(token) under the logits at each position (logits[:, t] scores tokens[:, t])."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


EV_MIN_VARIANCE = 1e-8  # returns lie in [-1, 3]: a variance under this is rounding, not signal


@torch.no_grad()
def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over model tokens: 1 is a perfect critic, <= 0 a useless one; NaN
    when the returns do not vary (all equal up to rounding, as when every episode scored -1: nothing to explain,
    and dividing by rounding noise gave -2.9e10 in the recipe's CPU smoke test)."""
    var = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    residual = returns - values
    var_residual = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    return float(1 - var_residual / var) if var > EV_MIN_VARIANCE else float("nan")


def tis_weights(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling: min(pi_trainer / pi_sampler, cap) per token, constant to the gradient. The
    tokens were drawn by the sampler (another precision, another kernel) while PPO's ratio is taken against the
    trainer's own log-probs; this corrects the mismatch without letting a rare token's weight explode."""
    return torch.exp(trainer_logp - sampler_logp).clamp(max=cap).detach()


def ppo_losses(config: PPOConfig, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
               values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               ref_logp: torch.Tensor | None = None, token_entropy: torch.Tensor | None = None,
               sampler_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """The actor's loss (surrogate, + KL to the reference, - entropy bonus, as configured) and the critic's, with
    their statistics. `advantages` as GAE gave them: whitened here when the config says so. With `config.tis_cap`
    and the sampler's log-probs, the surrogate is importance-weighted (`tis_weights`)."""
    if config.whiten_advantages:
        advantages = masked_whiten(advantages, mask)
    weights = None
    if config.tis_cap is not None and sampler_logp is not None:
        weights = tis_weights(old_logp, sampler_logp, config.tis_cap)
    actor, stats = policy_loss(logp, old_logp, advantages, mask, config.clip_low, config.clip_high, weights)
    if weights is not None:
        stats["tis_weight_mean"] = float(masked_mean(weights, mask))
    if config.kl_coef and ref_logp is not None:
        kl = masked_mean(kl_penalty(logp, ref_logp), mask)
        actor = actor + config.kl_coef * kl
        stats["kl"] = float(kl.detach())
    if token_entropy is not None:
        mean_entropy = masked_mean(token_entropy, mask)
        actor = actor - config.entropy_coef * mean_entropy
        stats["entropy"] = float(mean_entropy.detach())
    critic, value_stats = value_loss(values, old_values, returns, mask, config.value_clip)
    stats.update(value_stats, policy_loss=float(actor.detach()), value_loss=float(critic.detach()))
    return actor, critic, stats
